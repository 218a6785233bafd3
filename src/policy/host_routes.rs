//! Route rules scoped to a host: one client often talks to several APIs, and a rule for one
//! must never apply to another.

use http::Method;

use crate::build_error::BuildError;
use crate::classify::host::{HostScope, RequestHost};
use crate::classify::routes::RouteTable;
use crate::classify::Idempotency;

/// A route table per host scope (canonical host, and a port or every port). Few hosts: a scan.
#[derive(Clone, Debug, Default)]
pub(crate) struct HostRoutes(Vec<(HostScope, RouteTable)>);

impl HostRoutes {
    pub(crate) fn insert(
        &mut self,
        host: &str,
        method: Method,
        template: &str,
        idempotency: Idempotency,
    ) -> Result<(), BuildError> {
        let scope = host_scope("route_for_host", host)?;
        let table = match self.0.iter().position(|(h, _)| *h == scope) {
            Some(i) => &mut self.0[i].1,
            None => {
                self.0.push((scope, RouteTable::default()));
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

    /// The rule for this request if its host has rules and one matches: the rules for its
    /// host and port first, then those for its host on every port.
    #[inline]
    pub(crate) fn lookup(
        &self,
        host: Option<&RequestHost<'_>>,
        method: &Method,
        path: &str,
    ) -> Option<Idempotency> {
        // Most policies scope no rule to a host: no call for them.
        if self.0.is_empty() {
            return None;
        }
        match host {
            Some(host) => self.lookup_scoped(host, method, path),
            // The host is not visible, so the request may be for any host a rule names: a rule
            // that calls it a write holds (fail closed); one that calls it idempotent does not.
            None => self
                .0
                .iter()
                .filter_map(|(_, table)| table.lookup(method, path))
                .find(|rule| *rule == Idempotency::NonIdempotent),
        }
    }

    fn lookup_scoped(
        &self,
        host: &RequestHost<'_>,
        method: &Method,
        path: &str,
    ) -> Option<Idempotency> {
        let mut any_port = None;
        for (scope, table) in &self.0 {
            if host.port.is_none() && scope.port.is_some() && *scope.host == *host.host {
                // The request names this host but not its port (a `Host` header without one,
                // an origin given as a host): it may be for the scope's port. A rule there that
                // calls it a write holds (fail closed); one that calls it idempotent does not.
                if let Some(rule @ Idempotency::NonIdempotent) = table.lookup(method, path) {
                    return Some(rule);
                }
                continue;
            }
            if !scope.covers(&host.host, host.port) {
                continue;
            }
            if scope.port.is_none() {
                any_port = Some(table);
            } else if let Some(rule) = table.lookup(method, path) {
                return Some(rule);
            }
        }
        any_port?.lookup(method, path)
    }
}

/// The scope of a policy's origin (`RetryPolicy::for_origin`): a host scope that a channel
/// can send to, and on its scheme's default port when it names none.
pub(crate) fn origin_scope(origin: &str) -> Result<HostScope, BuildError> {
    let mut scope = host_scope("for_origin", origin)?;
    let scheme = origin.split_once("://").map(|(scheme, _)| scheme);
    // Named without the rest of the input: a base URL's path or query is not for messages.
    let refuse = |why| BuildError::host("for_origin", &scope.host, why);
    if scheme.is_some_and(|s| !s.eq_ignore_ascii_case("http") && !s.eq_ignore_ascii_case("https")) {
        return Err(refuse("a channel sends over http or https"));
    }
    let unspecified = match scope
        .host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
    {
        Ok(ip) => std::net::IpAddr::is_unspecified(&ip),
        Err(_) => false,
    };
    if unspecified {
        return Err(refuse(
            "an unspecified address is no host a channel sends to",
        ));
    }
    if scope.port.is_none() {
        // A base URL on its scheme's default port reaches that port.
        scope.port = scheme.and_then(crate::classify::host::default_port);
    }
    Ok(scope)
}

/// A host scope as a setting names it, or an error that names `setting` and the input.
pub(crate) fn host_scope(setting: &'static str, host: &str) -> Result<HostScope, BuildError> {
    HostScope::parse(host).map_err(|why| match host.rsplit_once('@') {
        // User information may be a password: the error names the rest only.
        Some((user, rest)) => {
            let scheme = user.split_once("://").map_or("", |(scheme, _)| scheme);
            let sep = if scheme.is_empty() { "" } else { "://" };
            BuildError::host(setting, &format!("{scheme}{sep}…@{rest}"), why)
        }
        None => BuildError::host(setting, host, why),
    })
}
