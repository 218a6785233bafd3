//! When retries happen: backoff, jitter, the longest Retry-After, deadlines.

use super::*;

impl RetryPolicyBuilder {
    /// Exponential backoff: the first retry waits about `initial`, each next one twice as
    /// long, never more than `max`; each wait is drawn at random in `[delay/2, delay]`.
    ///
    /// Defaults to 500 ms and 8 s. `initial` must not exceed `max`.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.timing.backoff = Backoff { initial, max };
        self
    }

    /// Whether backoff waits are randomised. Turn it off for reproducible waits (tests);
    /// each wait is then exactly the exponential delay.
    ///
    /// Defaults to true.
    pub fn jitter(mut self, jitter: bool) -> Self {
        self.timing.jitter = jitter;
        self
    }

    /// The longest `Retry-After` the policy waits for. A response asking for longer is final
    /// and its report says so.
    ///
    /// Defaults to 60 s.
    pub fn max_retry_after(mut self, max: Duration) -> Self {
        self.responses.max_retry_after = max;
        self
    }

    /// Total time for a request, counted from its first attempt. An attempt still in flight
    /// when it passes is cut, and a retry whose wait would end past it is not made. A cut
    /// attempt ends in this crate's [`Error`](crate::attempts::Error), not a bare timeout: it
    /// [`is_timeout`](crate::attempts::Error::is_timeout), and it
    /// [`is_ambiguous`](crate::attempts::Error::is_ambiguous) (it may have reached the server;
    /// a write [`may_have_been_applied`](crate::attempts::Error::may_have_been_applied)), with
    /// the report, the request id and the idempotency key — which a `tower::timeout` outside
    /// the layer would lose.
    ///
    /// Per request: [`RequestOptions::deadline`](crate::policy::RequestOptions::deadline).
    ///
    /// Defaults to none. Must be above zero.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.timing.deadline = Some(deadline);
        self
    }

    /// Time for each attempt: an attempt still in flight when it passes is cut, and that
    /// failure is ambiguous (the request may have been applied), so an idempotent request is
    /// retried and a write is not. The same as a `tower::timeout` inside the layer, except that
    /// a cut that coincides with the deadline ends the request with this crate's error.
    ///
    /// Per request: [`RequestOptions::attempt_timeout`](crate::policy::RequestOptions::attempt_timeout).
    ///
    /// Defaults to none. Must be above zero.
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.timing.attempt_timeout = Some(timeout);
        self
    }
}
