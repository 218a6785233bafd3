//! Route rules scoped to a host: one client often talks to several APIs, and a rule for one
//! must never apply to another.

use http::Method;

use super::builder::BuildError;
use crate::classify::routes::RouteTable;
use crate::classify::Idempotency;

/// A route table per host (lowercase, without port). Few hosts: a scan.
#[derive(Clone, Debug, Default)]
pub(crate) struct HostRoutes(Vec<(Box<str>, RouteTable)>);

impl HostRoutes {
    pub(crate) fn insert(
        &mut self,
        host: &str,
        method: Method,
        template: &str,
        idempotency: Idempotency,
    ) -> Result<(), BuildError> {
        let host = check_host("route_for_host", host)?;
        let table = match self.0.iter().position(|(h, _)| **h == *host) {
            Some(i) => &mut self.0[i].1,
            None => {
                self.0.push((host.into(), RouteTable::default()));
                let last = self.0.len() - 1;
                &mut self.0[last].1
            }
        };
        table
            .insert(method, template, idempotency)
            .map_err(|e| e.for_setting("route_for_host"))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The rule for this request if its host has rules and one matches.
    #[inline]
    pub(crate) fn lookup(
        &self,
        host: Option<&str>,
        method: &Method,
        path: &str,
    ) -> Option<Idempotency> {
        if self.0.is_empty() {
            return None;
        }
        let host = host?;
        let (_, table) = self.0.iter().find(|(h, _)| h.eq_ignore_ascii_case(host))?;
        table.lookup(method, path)
    }
}

/// A host as the builder takes it — the name alone, no scheme, path or port — lowercased;
/// or an error that names `setting` and the host.
pub(crate) fn check_host(setting: &'static str, host: &str) -> Result<String, BuildError> {
    let bad = |why: &str| Err(BuildError::host(setting, host, why));
    if host.is_empty() {
        return bad("it is empty");
    }
    if host.contains("://") || host.contains('/') {
        return bad("give the host alone, without scheme or path");
    }
    if !host.starts_with('[') && host.contains(':') {
        return bad("give the host without a port: it covers every port");
    }
    if host.bytes().any(|b| !b.is_ascii_graphic()) {
        return bad("a host is visible ASCII");
    }
    Ok(host.to_ascii_lowercase())
}
