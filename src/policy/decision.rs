//! What the policy decides after an attempt ([`Decision`], and why it stops: [`StopReason`]),
//! and the facts it decides from; how it decides is `decide.rs`.

use std::time::Duration;

use crate::classify::{Classification, RequestVerdict};

/// What to do after an attempt.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Send the request again after this wait.
    Retry {
        /// The wait: the server's Retry-After if it gave one, otherwise the backoff.
        after: Duration,
    },
    /// Stop here and hand the outcome to the caller.
    Stop(StopReason),
}

/// Why a request was not retried (again).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// The outcome is final: a success, a non-transient status or error.
    Final,
    /// The request is not idempotent and the attempt may have been applied (an ambiguous
    /// failure or a retryable response), so repeating it could repeat its side effect.
    SuppressedNotIdempotent,
    /// The policy's `max_retries` were used up.
    RetriesExhausted,
    /// The retry budget refused: too many retries lately compared with requests.
    Budget,
    /// The next attempt could not start before the policy's deadline.
    Deadline,
    /// The server asked to wait longer than the policy's `max_retry_after`.
    RetryAfterTooLong,
    /// The request carries the [`NoRetry`](crate::classify::NoRetry) marker.
    NoRetryMarker,
    /// The request body could not be sent again: a stream that is not recorded, one past the
    /// replay buffer's limit, a response before its end…
    /// ([`RetryReport::body_not_replayable`](crate::attempts::RetryReport::body_not_replayable) says which).
    BodyNotReplayable,
    /// An outer retry layer made this attempt; it decides about retries, not this one.
    RetriedByOuterLayer,
    /// The inner service failed while getting ready for the next attempt.
    ServiceNotReady,
    /// The response is the server's stored response: its first answer to an earlier attempt with
    /// the same idempotency key, sent again (see
    /// [`stored_response_header`](crate::RetryPolicyBuilder::stored_response_header)): the server had already run
    /// the request, and every repeat of the key gets this same answer, whatever its status.
    StoredResponse,
    /// The next attempt (or the first) could not start before the caller's deadline: the
    /// deadline the handler this request is sent from was called with, less the margin for
    /// the way back (see the [`deadline`](crate::deadline) module). Nobody would read its
    /// answer.
    CallerDeadline,
}

impl StopReason {
    /// A short lowercase name, for logs and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Final => "final",
            StopReason::SuppressedNotIdempotent => "suppressed-not-idempotent",
            StopReason::RetriesExhausted => "retries-exhausted",
            StopReason::Budget => "budget",
            StopReason::Deadline => "deadline",
            StopReason::RetryAfterTooLong => "retry-after-too-long",
            StopReason::NoRetryMarker => "no-retry-marker",
            StopReason::BodyNotReplayable => "body-not-replayable",
            StopReason::RetriedByOuterLayer => "retried-by-outer-layer",
            StopReason::ServiceNotReady => "service-not-ready",
            StopReason::StoredResponse => "stored-response",
            StopReason::CallerDeadline => "caller-deadline",
        }
    }
}

/// Everything the decision depends on besides the policy's settings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Facts<'a> {
    pub(crate) verdict: &'a RequestVerdict,
    pub(crate) outcome: &'a Classification,
    /// Retries already made (0 after the first attempt).
    pub(crate) retries_done: u32,
    /// Retries allowed for this request: the policy's, or the request's own option.
    pub(crate) max_retries: u32,
    /// Time before the deadline, if the policy has one.
    pub(crate) time_left: Option<Duration>,
    /// Whether the request can be sent again (its body can be replayed).
    pub(crate) replayable: bool,
}
