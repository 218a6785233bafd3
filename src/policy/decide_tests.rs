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
    let c = Classification::with_retry_after(FailureClass::RetryableResponse, Some(Duration::ZERO));
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
