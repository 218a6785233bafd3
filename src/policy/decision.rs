//! The decision table of the crate docs ("The decision model"), as one function.

use std::time::Duration;

use super::RetryPolicy;
use crate::backoff;
use crate::classify::{Classification, FailureClass, RequestVerdict};

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
    /// [`stored_response_header`](crate::policy::RetryPolicyBuilder::stored_response_header)): the server had already run
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

impl RetryPolicy {
    /// Decides whether to retry after an attempt: the table of
    /// [the decision model](crate#the-decision-model), then attempts left, the deadline and the
    /// budget, in that order.
    ///
    /// `retries_done` is the number of retries already made (0 after the first attempt);
    /// `time_left` is the time before the caller's deadline, if any. When the answer is
    /// [`Decision::Retry`], one retry has been withdrawn from the policy's budget. The wait is
    /// drawn with jitter if the policy has it. Allocates nothing.
    ///
    /// ```
    /// use tower_retry_safety::policy::Decision;
    /// use tower_retry_safety::{FailureClass, RetryPolicy, StopReason};
    ///
    /// let policy = RetryPolicy::builder().jitter(false).build()?;
    /// let post = http::Request::post("/v1/messages").body(())?;
    /// let verdict = policy.classify(&post);
    ///
    /// // The write may have been applied: never repeat it.
    /// let ambiguous = FailureClass::Ambiguous.into();
    /// assert_eq!(
    ///     policy.decide(&verdict, &ambiguous, 0, None),
    ///     Decision::Stop(StopReason::SuppressedNotIdempotent)
    /// );
    /// // It never reached the server: safe to send again.
    /// let not_sent = FailureClass::NotSent.into();
    /// assert!(matches!(policy.decide(&verdict, &not_sent, 0, None), Decision::Retry { .. }));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn decide(
        &self,
        verdict: &RequestVerdict,
        outcome: &Classification,
        retries_done: u32,
        time_left: Option<Duration>,
    ) -> Decision {
        let facts = Facts {
            verdict,
            outcome,
            retries_done,
            max_retries: self.inner.max_retries,
            time_left,
            replayable: true,
        };
        self.decide_with(facts, || self.jitter_unit(), || self.withdraw())
    }

    /// The draw for the backoff: random when the policy has jitter, 1.0 (the full delay)
    /// otherwise.
    pub(crate) fn jitter_unit(&self) -> f64 {
        if self.inner.jitter {
            backoff::random_unit()
        } else {
            1.0
        }
    }

    pub(crate) fn withdraw(&self) -> bool {
        self.inner.budget.as_ref().is_none_or(|b| b.withdraw())
    }

    pub(crate) fn deposit(&self) {
        if let Some(budget) = &self.inner.budget {
            budget.deposit();
        }
    }

    /// The pure decision. `jitter_unit` is drawn only when the backoff applies, and
    /// `withdraw` is called last, only when everything else allows a retry, so that a refused
    /// retry never spends budget and a success never reads the random source.
    pub(crate) fn decide_with(
        &self,
        facts: Facts<'_>,
        jitter_unit: impl FnOnce() -> f64,
        withdraw: impl FnOnce() -> bool,
    ) -> Decision {
        use StopReason::*;
        let verdict = facts.verdict;
        if verdict.is_no_retry() {
            return Decision::Stop(NoRetryMarker);
        }
        match facts.outcome.class() {
            FailureClass::Final if facts.outcome.is_stored_response() => {
                return Decision::Stop(StoredResponse)
            }
            FailureClass::Final => return Decision::Stop(Final),
            // A write that may have been applied is never repeated: that reason comes before
            // any other (a wait too long, the budget, the deadline).
            FailureClass::Ambiguous | FailureClass::RetryableResponse
                if !verdict.repeat_is_harmless() =>
            {
                return Decision::Stop(SuppressedNotIdempotent)
            }
            _ if facts.outcome.is_retry_after_too_long() => {
                return Decision::Stop(RetryAfterTooLong)
            }
            // NotSent for anything; Ambiguous and RetryableResponse for harmless repeats.
            _ => {}
        }
        if !facts.replayable {
            return Decision::Stop(BodyNotReplayable);
        }
        if facts.retries_done >= facts.max_retries {
            return Decision::Stop(RetriesExhausted);
        }
        let after = facts
            .outcome
            .retry_after()
            .unwrap_or_else(|| self.inner.backoff.delay(facts.retries_done, jitter_unit()));
        if facts.time_left.is_some_and(|left| after >= left) {
            return Decision::Stop(Deadline);
        }
        if !withdraw() {
            return Decision::Stop(Budget);
        }
        Decision::Retry { after }
    }
}

#[cfg(test)]
#[path = "decision_tests.rs"]
mod tests;
