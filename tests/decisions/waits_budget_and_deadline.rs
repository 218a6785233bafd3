//! The layer over a scripted inner service, with paused tokio time: exact waits (backoff and
//! `Retry-After`), retries exhausted, the retry budget, and the deadline.

use std::time::Duration;

use crate::scripted_layer::{builder, get, report, run};
use retry_safety_testing::script::{ok, status, Refused, Reset, Script, Status};
use tower::{Layer, ServiceExt};
use tower_retry_safety::{RetryReport, StopReason};

// --- timing: backoff and Retry-After, exactly ---

#[tokio::test(start_paused = true)]
async fn backoff_doubles_without_jitter() {
    let script = Script::new([Refused, Refused, Refused, ok()]);
    let out = run(builder().max_retries(3), &script, get()).await;
    assert_eq!(script.call_times_ms(), [0, 500, 1500, 3500]);
    let delays: Vec<_> = report(&out).attempt_outcomes().map(|a| a.delay()).collect();
    let ms = |n| Some(Duration::from_millis(n));
    assert_eq!(delays, [ms(500), ms(1000), ms(2000), None]);
    assert_eq!(out.unwrap().status(), 200);
}

#[tokio::test(start_paused = true)]
async fn retry_after_delays_are_exact() {
    let script = Script::new([
        Status(503, vec![("retry-after", "7")]),
        Status(429, vec![("retry-after-ms", "1500")]),
        Status(503, vec![("retry-after", "not-a-number")]),
        ok(),
    ]);
    let out = run(builder().max_retries(3), &script, get()).await;
    // 7 s, then 1.5 s, then the third backoff step (2 s) because the hint was unreadable.
    assert_eq!(script.call_times_ms(), [0, 7000, 8500, 10500]);
    let r = report(&out);
    let delays: Vec<_> = r.attempt_outcomes().map(|a| a.delay()).collect();
    assert_eq!(
        delays,
        [
            Some(Duration::from_secs(7)),
            Some(Duration::from_millis(1500)),
            Some(Duration::from_secs(2)),
            None
        ]
    );
    let statuses: Vec<_> = r
        .attempt_outcomes()
        .map(|a| a.status().map(|s| s.as_u16()))
        .collect();
    assert_eq!(statuses, [Some(503), Some(429), Some(503), Some(200)]);
}

#[tokio::test(start_paused = true)]
async fn retry_after_above_the_cap_ends_the_retries() {
    let script = Script::new([Status(503, vec![("retry-after", "120")]), ok()]);
    let out = run(
        builder().max_retry_after(Duration::from_secs(60)),
        &script,
        get(),
    )
    .await;
    assert_eq!(script.count(), 1);
    let res = out.unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(
        res.extensions().get::<RetryReport>().unwrap().stop_reason(),
        StopReason::RetryAfterTooLong
    );
}

#[tokio::test(start_paused = true)]
async fn retries_exhausted_returns_the_last_response() {
    let script = Script::new([status(503), status(502), status(504), ok()]);
    let out = run(builder().max_retries(2), &script, get()).await;
    assert_eq!(script.count(), 3);
    let res = out.unwrap();
    assert_eq!(res.status(), 504);
    let r = res.extensions().get::<RetryReport>().unwrap();
    assert_eq!(r.stop_reason(), StopReason::RetriesExhausted);
    assert_eq!(r.attempts(), 3);
}

#[tokio::test(start_paused = true)]
async fn retries_exhausted_on_errors_is_an_error() {
    let script = Script::new([Reset, Reset, Reset]);
    let err = run(builder().max_retries(2), &script, get())
        .await
        .unwrap_err();
    assert_eq!(script.count(), 3);
    assert_eq!(err.attempts(), 3);
    assert!(err.is_ambiguous());
    assert_eq!(
        err.to_string(),
        "GET /v1/things/1 failed after 3 attempts (no retries were left): the last attempt \
         lost its connection after it was sent. Repeating it is harmless."
    );
}

// --- budget and deadline ---

#[tokio::test(start_paused = true)]
async fn budget_exhausted_stops_retries() {
    // No reserve and no share of deposits: the budget never allows a retry.
    let policy = builder().tps_budget(Duration::from_secs(10), 0, 0.0);
    let script = Script::new([status(503), ok()]);
    let out = run(policy, &script, get()).await;
    assert_eq!(script.count(), 1);
    assert_eq!(report(&out).stop_reason(), StopReason::Budget);
}

#[tokio::test(start_paused = true)]
async fn budget_is_shared_by_clones_and_spent_per_retry() {
    // Reserve: 1 retry/s over a 1 s window = 1 retry, and deposits earn nothing.
    let policy = builder()
        .tps_budget(Duration::from_secs(1), 1, 0.0)
        .build()
        .unwrap();
    let a = Script::new([status(503), ok()]);
    let b = Script::new([status(503), ok()]);
    let out_a = policy.clone().layer(a.clone()).oneshot(get()).await;
    let out_b = policy.layer(b.clone()).oneshot(get()).await;
    assert_eq!((a.count(), b.count()), (2, 1));
    assert_eq!(report(&out_a).stop_reason(), StopReason::Final);
    assert_eq!(report(&out_b).stop_reason(), StopReason::Budget);
}

#[tokio::test(start_paused = true)]
async fn deadline_stops_a_retry_that_would_end_past_it() {
    let policy = builder()
        .max_retries(5)
        .deadline(Duration::from_millis(1200));
    let script = Script::new([Refused, Refused, Refused, ok()]);
    let err = run(policy, &script, get()).await.unwrap_err();
    // 0 ms, 500 ms; the next wait (1 s) would end at 1.5 s, past the 1.2 s deadline.
    assert_eq!(script.call_times_ms(), [0, 500]);
    assert_eq!(err.stop_reason(), StopReason::Deadline);
    assert!(err.is_not_sent());
}
