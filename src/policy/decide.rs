//! How the policy decides after an attempt: the decision table of the crate docs ("The
//! decision model"), as one function; what it decides is [`Decision`](super::Decision).

use std::time::Duration;

use super::decision::{Decision, Facts, StopReason};
use super::retry_policy::RetryPolicy;
use crate::backoff;
use crate::classify::{Classification, FailureClass, RequestVerdict};

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
#[path = "decide_tests.rs"]
mod tests;
