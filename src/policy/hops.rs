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
        let host = seen().target(origin)?;
        self.hosts
            .iter()
            .find(|(h, _)| h.covers(&host.host, host.port))
            .map(|(_, convention)| *convention)
    }
}
