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
    /// The request carries the [`NoRetry`](crate::NoRetry) marker.
    NoRetryMarker,
    /// The request body could not be sent again: a stream that is not recorded, one past the
    /// replay buffer's limit, a response before its end…
    /// ([`RetryReport::body_not_replayable`](crate::RetryReport::body_not_replayable) says which).
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
    /// use tower_retry_safety::{Decision, FailureClass, RetryPolicy, StopReason};
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
mod tests {
    use super::*;
    use crate::classify::{Idempotency, NoRetry, VerdictSource};
    use std::cell::Cell;

    const IDEMPOTENT: RequestVerdict =
        RequestVerdict::new(Idempotency::Idempotent, VerdictSource::Method);
    const NON_IDEMPOTENT: RequestVerdict =
        RequestVerdict::new(Idempotency::NonIdempotent, VerdictSource::Method);

    fn policy() -> RetryPolicy {
        RetryPolicy::builder()
            .jitter(false)
            .backoff(Duration::from_millis(100), Duration::from_secs(1))
            .max_retries(2)
            .build()
            .unwrap()
    }

    fn decide(verdict: &RequestVerdict, outcome: Classification) -> Decision {
        decide_full(verdict, outcome, 0, None, true, true)
    }

    fn decide_full(
        verdict: &RequestVerdict,
        outcome: Classification,
        retries_done: u32,
        time_left: Option<Duration>,
        replayable: bool,
        budget: bool,
    ) -> Decision {
        let facts = Facts {
            verdict,
            outcome: &outcome,
            retries_done,
            max_retries: policy().inner.max_retries,
            time_left,
            replayable,
        };
        policy().decide_with(facts, || 1.0, || budget)
    }

    fn retry_after_ms(ms: u64) -> Decision {
        Decision::Retry {
            after: Duration::from_millis(ms),
        }
    }

    fn no_retry_verdict() -> RequestVerdict {
        let mut req = http::Request::get("/x").body(()).unwrap();
        req.extensions_mut().insert(NoRetry);
        policy().classify(&req)
    }

    // --- the table, row by row ---

    #[test]
    fn idempotent_not_sent_retries() {
        assert_eq!(
            decide(&IDEMPOTENT, FailureClass::NotSent.into()),
            retry_after_ms(100)
        );
    }

    #[test]
    fn idempotent_ambiguous_retries() {
        assert_eq!(
            decide(&IDEMPOTENT, FailureClass::Ambiguous.into()),
            retry_after_ms(100)
        );
    }

    #[test]
    fn idempotent_retryable_response_honours_retry_after() {
        let c = Classification::with_retry_after(
            FailureClass::RetryableResponse,
            Some(Duration::from_secs(3)),
        );
        assert_eq!(decide(&IDEMPOTENT, c), retry_after_ms(3000));
        // Without a hint the backoff applies.
        let c = FailureClass::RetryableResponse.into();
        assert_eq!(decide(&IDEMPOTENT, c), retry_after_ms(100));
    }

    #[test]
    fn idempotent_final_returns() {
        assert_eq!(
            decide(&IDEMPOTENT, FailureClass::Final.into()),
            Decision::Stop(StopReason::Final)
        );
    }

    #[test]
    fn non_idempotent_not_sent_retries() {
        assert_eq!(
            decide(&NON_IDEMPOTENT, FailureClass::NotSent.into()),
            retry_after_ms(100)
        );
    }

    #[test]
    fn non_idempotent_ambiguous_is_suppressed() {
        assert_eq!(
            decide(&NON_IDEMPOTENT, FailureClass::Ambiguous.into()),
            Decision::Stop(StopReason::SuppressedNotIdempotent)
        );
    }

    #[test]
    fn non_idempotent_retryable_response_is_suppressed() {
        let c =
            Classification::with_retry_after(FailureClass::RetryableResponse, Some(Duration::ZERO));
        assert_eq!(
            decide(&NON_IDEMPOTENT, c),
            Decision::Stop(StopReason::SuppressedNotIdempotent)
        );
    }

    #[test]
    fn a_key_without_trust_is_the_non_idempotent_row() {
        let untrusted = NON_IDEMPOTENT.with_key(true);
        assert!(!untrusted.is_keyed());
        assert_eq!(
            decide(&untrusted, FailureClass::Ambiguous.into()),
            Decision::Stop(StopReason::SuppressedNotIdempotent)
        );
    }

    #[test]
    fn keyed_non_idempotent_row_is_the_idempotent_row() {
        let keyed = NON_IDEMPOTENT.with_key_trust(true).with_key(true);
        assert_eq!(
            decide(&keyed, FailureClass::Ambiguous.into()),
            retry_after_ms(100)
        );
        assert_eq!(
            decide(&keyed, FailureClass::RetryableResponse.into()),
            retry_after_ms(100)
        );
        assert_eq!(
            decide(&keyed, FailureClass::NotSent.into()),
            retry_after_ms(100)
        );
        assert_eq!(
            decide(&keyed, FailureClass::Final.into()),
            Decision::Stop(StopReason::Final)
        );
    }

    #[test]
    fn non_idempotent_final_returns() {
        assert_eq!(
            decide(&NON_IDEMPOTENT, FailureClass::Final.into()),
            Decision::Stop(StopReason::Final)
        );
    }

    #[test]
    fn no_retry_returns_in_every_column() {
        let v = no_retry_verdict();
        for class in [
            FailureClass::NotSent,
            FailureClass::Ambiguous,
            FailureClass::RetryableResponse,
            FailureClass::Final,
        ] {
            assert_eq!(
                decide(&v, class.into()),
                Decision::Stop(StopReason::NoRetryMarker),
                "{class:?}"
            );
        }
    }

    // --- the other conditions a retry needs ---

    #[test]
    fn retries_exhausted() {
        let c = FailureClass::NotSent.into();
        assert_eq!(
            decide_full(&IDEMPOTENT, c, 1, None, true, true),
            retry_after_ms(200)
        );
        assert_eq!(
            decide_full(&IDEMPOTENT, c, 2, None, true, true),
            Decision::Stop(StopReason::RetriesExhausted)
        );
    }

    #[test]
    fn deadline_refuses_a_wait_that_ends_past_it() {
        let c = FailureClass::Ambiguous.into();
        let left = Some(Duration::from_millis(100));
        assert_eq!(
            decide_full(&IDEMPOTENT, c, 0, left, true, true),
            Decision::Stop(StopReason::Deadline)
        );
        let left = Some(Duration::from_millis(101));
        assert_eq!(
            decide_full(&IDEMPOTENT, c, 0, left, true, true),
            retry_after_ms(100)
        );
    }

    #[test]
    fn budget_is_asked_last_and_can_refuse() {
        let c = FailureClass::NotSent.into();
        assert_eq!(
            decide_full(&IDEMPOTENT, c, 0, None, true, false),
            Decision::Stop(StopReason::Budget)
        );
        // A retry refused for another reason never spends budget.
        let asked = Cell::new(false);
        let facts = Facts {
            verdict: &NON_IDEMPOTENT,
            outcome: &FailureClass::Ambiguous.into(),
            retries_done: 0,
            max_retries: 2,
            time_left: None,
            replayable: true,
        };
        let d = policy().decide_with(
            facts,
            || 1.0,
            || {
                asked.set(true);
                true
            },
        );
        assert_eq!(d, Decision::Stop(StopReason::SuppressedNotIdempotent));
        assert!(!asked.get());
    }

    #[test]
    fn body_not_replayable() {
        assert_eq!(
            decide_full(
                &IDEMPOTENT,
                FailureClass::NotSent.into(),
                0,
                None,
                false,
                true
            ),
            Decision::Stop(StopReason::BodyNotReplayable)
        );
        // Suppression is reported before replayability: it is the more important reason.
        assert_eq!(
            decide_full(
                &NON_IDEMPOTENT,
                FailureClass::Ambiguous.into(),
                0,
                None,
                false,
                true
            ),
            Decision::Stop(StopReason::SuppressedNotIdempotent)
        );
    }

    #[test]
    fn retry_after_too_long() {
        let long = |class| Classification::retry_after_too_long(class, Duration::from_secs(600));
        for class in [FailureClass::RetryableResponse, FailureClass::NotSent] {
            assert_eq!(
                decide(&IDEMPOTENT, long(class)),
                Decision::Stop(StopReason::RetryAfterTooLong)
            );
        }
        // Not applied, so a write would be sent again but for the wait.
        assert_eq!(
            decide(&NON_IDEMPOTENT, long(FailureClass::NotSent)),
            Decision::Stop(StopReason::RetryAfterTooLong)
        );
        // A write that may have been applied: its own reason comes first (issue 41, item 7).
        assert_eq!(
            decide(&NON_IDEMPOTENT, long(FailureClass::RetryableResponse)),
            Decision::Stop(StopReason::SuppressedNotIdempotent)
        );
    }

    #[test]
    fn jitter_unit_is_applied() {
        let facts = Facts {
            verdict: &IDEMPOTENT,
            outcome: &FailureClass::NotSent.into(),
            retries_done: 1,
            max_retries: 2,
            time_left: None,
            replayable: true,
        };
        assert_eq!(
            policy().decide_with(facts, || 0.0, || true),
            retry_after_ms(100)
        );
    }

    #[test]
    fn public_decide_spends_the_shared_budget() {
        let p = RetryPolicy::builder()
            .tps_budget(Duration::from_secs(1), 0, 0.0)
            .build()
            .unwrap();
        let d = p.decide(&IDEMPOTENT, &FailureClass::NotSent.into(), 0, None);
        assert_eq!(d, Decision::Stop(StopReason::Budget));
    }
}
