//! Deadlines that cross hops (see the [`deadline`](crate::deadline) module).

use super::*;

impl RetryPolicyBuilder {
    /// Hands each HTTP request's deadline and attempt number on to `host` (`api.internal`,
    /// `api.internal:8443`, or a URL's origin), in this crate's own headers
    /// ([`Convention::Own`](crate::deadline::Convention::Own)): the time the client waits for
    /// that attempt (the earlier of its attempt timeout and the deadline), in whole
    /// milliseconds rounded down, in [`TIMEOUT_HEADER`](crate::deadline::TIMEOUT_HEADER), and
    /// the attempt's number in [`ATTEMPT_HEADER`](crate::deadline::ATTEMPT_HEADER) — for a
    /// server that reads them (the server crate's deadline layer does). Call it once per
    /// host; [`send_deadline_to_as`](Self::send_deadline_to_as) picks another convention. A
    /// request whose host is not known sends neither, and neither goes to a host a redirect
    /// points at (see the [`deadline`](crate::deadline) module). gRPC calls always carry
    /// `grpc-timeout` and, on a resend, `grpc-previous-rpc-attempts`, which every gRPC server
    /// reads.
    ///
    /// Defaults to no host: a client does not send headers an API did not ask for.
    /// [`build`](Self::build) refuses a host that is not one.
    pub fn send_deadline_to(self, host: &str) -> Self {
        self.send_deadline_to_as(host, crate::deadline::Convention::Own)
    }

    /// [`send_deadline_to`](Self::send_deadline_to) in the headers `convention` names:
    /// this crate's own, Envoy's or the Connect protocol's, whichever the host's server reads.
    /// The first call that names a host decides its convention.
    pub fn send_deadline_to_as(
        mut self,
        host: &str,
        convention: crate::deadline::Convention,
    ) -> Self {
        self.hops.hosts.push((host.to_owned(), convention));
        self
    }

    /// Whether a request sent from inside a handler inherits the deadline the handler's
    /// request arrived with ([`deadline::current`](crate::deadline::current)), less
    /// `margin` for the way back: its own deadline becomes the earlier of the two, and an
    /// attempt that cannot start before it is not sent
    /// ([`StopReason::CallerDeadline`](crate::policy::StopReason::CallerDeadline)).
    ///
    /// Defaults to inheriting, with a margin of 5 ms. `None` inherits nothing (and reads
    /// nothing).
    pub fn inherit_deadline(mut self, margin: Option<Duration>) -> Self {
        match margin {
            Some(margin) => {
                self.hops.inherit = true;
                self.hops.margin = margin;
            }
            None => self.hops.inherit = false,
        }
        self
    }

    /// Retry at one layer: when the inbound request's caller retries (it carried an attempt
    /// number, [`Inbound::caller_retries`](crate::deadline::Inbound::caller_retries)), a
    /// nested call makes at most `retries` resends (0: none, the caller's retry covers it).
    /// Three hops that each retry three times make up to 64 attempts at the last one; with
    /// `0` here on the inner hops, the chain makes as many as the outermost client does. The
    /// cost: a failure an inner hop would have retried in a few milliseconds waits for the
    /// caller's backoff and crosses every hop again.
    ///
    /// Defaults to none: nested calls retry as the policy says.
    pub fn retries_when_caller_retries(mut self, retries: u32) -> Self {
        self.hops.retries_when_caller_retries = Some(retries);
        self
    }
}

/// The settings as given, checked in `build`.
#[derive(Debug, Default)]
pub(super) struct HopSettings {
    pub(super) hosts: Vec<(String, crate::deadline::Convention)>,
    pub(super) inherit: bool,
    pub(super) margin: Duration,
    pub(super) retries_when_caller_retries: Option<u32>,
}

impl HopSettings {
    pub(super) fn new() -> Self {
        HopSettings {
            hosts: Vec::new(),
            inherit: true,
            margin: crate::policy::hops::DEFAULT_MARGIN,
            retries_when_caller_retries: None,
        }
    }

    pub(super) fn build(&self) -> Result<crate::policy::hops::Hops, BuildError> {
        let mut hops = crate::policy::hops::Hops {
            inherit: self.inherit,
            margin: self.margin,
            retries_when_caller_retries: self.retries_when_caller_retries,
            ..Default::default()
        };
        for (host, convention) in &self.hosts {
            hops.add_host(host, *convention)?;
        }
        hops.spell_hosts();
        Ok(hops)
    }
}
