//! What the policy does with deadlines that cross hops: to which hosts it hands the deadline
//! and attempt number on, whether nested calls inherit an inbound deadline, and how many
//! resends a nested call makes when its caller retries.

use std::time::Duration;

use super::host_routes::host_scope;
use crate::build_error::BuildError;
use crate::classify::host::{HostScope, HostSeen};
use crate::deadline::Convention;

/// The margin kept for the way back when a nested call inherits an inbound deadline.
pub(crate) const DEFAULT_MARGIN: Duration = Duration::from_millis(5);

#[derive(Clone, Debug)]
pub(crate) struct Hops {
    /// Hosts (and ports) an HTTP request hands its deadline and attempt number to, each in
    /// the convention its server reads.
    pub(crate) hosts: Vec<(HostScope, Convention)>,
    /// The authorities that name one of `hosts` exactly as written (`host`, or `host:port`
    /// for a scope limited to a port), for hosts named once: what the URI of a request to
    /// such a host usually holds.
    pub(crate) spellings: Vec<(Box<str>, Convention)>,
    /// Nested calls read the inbound deadline of the task they run in.
    pub(crate) inherit: bool,
    /// Kept for the way back: a nested call's deadline is the inbound one less this.
    pub(crate) margin: Duration,
    /// Resends a nested call may make when its caller retries; `None`: as many as usual.
    pub(crate) retries_when_caller_retries: Option<u32>,
}

impl Default for Hops {
    fn default() -> Self {
        Hops {
            hosts: Vec::new(),
            spellings: Vec::new(),
            inherit: true,
            margin: DEFAULT_MARGIN,
            retries_when_caller_retries: None,
        }
    }
}

impl Hops {
    pub(crate) fn add_host(
        &mut self,
        host: &str,
        convention: Convention,
    ) -> Result<(), BuildError> {
        self.hosts
            .push((host_scope("send_deadline_to", host)?, convention));
        Ok(())
    }

    /// Makes [`spelled`](Self::spelled)'s list once every host is added. A host named
    /// twice is left to [`sends_to`](Self::sends_to), whose first match decides.
    pub(crate) fn spell_hosts(&mut self) {
        self.spellings = self
            .hosts
            .iter()
            .filter(|(scope, _)| {
                self.hosts
                    .iter()
                    .filter(|(s, _)| s.host == scope.host)
                    .count()
                    == 1
            })
            .map(|(scope, convention)| {
                let spelling = match scope.port {
                    None => scope.host.to_string(),
                    Some(port) => format!("{}:{port}", scope.host),
                };
                (spelling.into_boxed_str(), *convention)
            })
            .collect();
    }

    /// The convention of a request whose URI's authority is `authority` and whose headers
    /// have no `Host`, when that authority is one of a named host's spellings: what
    /// [`sends_to`](Self::sends_to) finds for it, by one comparison. `None`: ask `sends_to`.
    #[inline]
    pub(crate) fn spelled(&self, authority: &str, headers: &http::HeaderMap) -> Option<Convention> {
        if self.spellings.is_empty() {
            return None;
        }
        let (_, convention) = self.spellings.iter().find(|(s, _)| **s == *authority)?;
        // A `Host` may name another host, or two: the slow look decides.
        (!headers.contains_key(http::header::HOST)).then_some(*convention)
    }

    /// The convention a request whose host is `seen` (an origin the layer was told aside)
    /// carries the deadline headers in, if it carries them; `seen` is asked only when the
    /// policy names hosts. A host that is not known gets none: the headers are for hosts that
    /// asked for them. The first host named that covers it decides.
    #[inline]
    pub(crate) fn sends_to<'h>(
        &self,
        seen: impl FnOnce() -> HostSeen<'h>,
        origin: Option<&HostScope>,
    ) -> Option<Convention> {
        if self.hosts.is_empty() {
            return None;
        }
        let seen = seen();
        // A host spelled exactly as a named one is that host (a canonical name is its own
        // canonical form): no canonical form to make, the common case when a client calls
        // the host it named.
        if let HostSeen::Uri(name, port) = seen {
            let exact = self.hosts.iter().find(|(h, _)| h.covers(name, port));
            if let Some((_, convention)) = exact {
                return Some(*convention);
            }
        }
        let host = seen.target(origin)?;
        self.hosts
            .iter()
            .find(|(h, _)| h.covers(&host.host, host.port))
            .map(|(_, convention)| *convention)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The one-comparison look (`spelled`) finds what the full look (`sends_to`, the URI
        /// parsed and its host made canonical) finds, whenever it finds anything: for hosts
        /// named with and without ports, twice, in capitals, with trailing dots.
        #[test]
        fn a_spelled_host_finds_what_the_full_look_finds(
            named in proptest::collection::vec(
                ("(api|API|b|127\\.0\\.0\\.1)(\\.)?", proptest::option::of(proptest::sample::select(vec![80u16, 443, 8080])), 0..3usize),
                1..4,
            ),
            authority in "(api|API|b|127\\.0\\.0\\.1)(\\.)?(:(80|443|8080))?",
            https in proptest::bool::ANY,
        ) {
            let conventions = [Convention::Own, Convention::Envoy, Convention::Connect];
            let mut hops = Hops::default();
            for (host, port, c) in &named {
                let spelled = match port {
                    Some(p) => format!("{host}:{p}"),
                    None => host.clone(),
                };
                if hops.add_host(&spelled, conventions[*c]).is_err() {
                    return Ok(());
                }
            }
            hops.spell_hosts();
            let scheme = if https { "https" } else { "http" };
            let Ok(uri) = format!("{scheme}://{authority}/x").parse::<http::Uri>() else {
                return Ok(());
            };
            let headers = http::HeaderMap::new();
            let full = hops.sends_to(
                || crate::classify::host::of_request(&uri, &headers, http::Version::HTTP_11),
                None,
            );
            if let Some(fast) = hops.spelled(&authority, &headers) {
                proptest::prop_assert_eq!(Some(fast), full);
            }
        }
    }
}
