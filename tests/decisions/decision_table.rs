//! The layer over a scripted inner service, with paused tokio time: every cell of the decision
//! table (the crate docs, "The decision model"), the idempotent, non-idempotent and `NoRetry`
//! rows, and a route rule for one host that never suppresses a retry to another.

use crate::scripted_layer::{builder, get, post, report, run, Out};
use http::{Method, Request};
use retry_safety_testing::script::{ok, status, Outcome, Refused, Reset, Script, Status, Timeout};
use tower_retry_safety::classify::VerdictSource;
use tower_retry_safety::{FailureClass, Idempotency, NoRetry, RetryReport, StopReason};

fn no_retry_get() -> Request<String> {
    let mut r = get();
    r.extensions_mut().insert(NoRetry);
    r
}

/// One cell: the first attempt ends in `first`, any later one succeeds.
async fn cell(req: Request<String>, first: Outcome) -> (usize, Out) {
    let script = Script::new([first, ok()]);
    let out = run(builder(), &script, req).await;
    (script.count(), out)
}

// --- the table: idempotent row ---

#[tokio::test(start_paused = true)]
async fn idempotent_not_sent_is_retried() {
    let (calls, out) = cell(get(), Refused).await;
    assert_eq!(calls, 2);
    assert_eq!(out.unwrap().status(), 200);
}

#[tokio::test(start_paused = true)]
async fn idempotent_ambiguous_is_retried() {
    for first in [Reset, Timeout] {
        let (calls, out) = cell(get(), first).await;
        assert_eq!(calls, 2);
        let r = report(&out);
        assert_eq!(r.attempts(), 2);
        let classes: Vec<_> = r.attempt_outcomes().map(|a| a.class()).collect();
        assert_eq!(classes, [FailureClass::Ambiguous, FailureClass::Final]);
    }
}

#[tokio::test(start_paused = true)]
async fn idempotent_retryable_response_is_retried() {
    for code in [408, 429, 500, 502, 503, 504] {
        let (calls, out) = cell(get(), status(code)).await;
        assert_eq!(calls, 2, "{code}");
        assert_eq!(out.unwrap().status(), 200);
    }
}

#[tokio::test(start_paused = true)]
async fn idempotent_final_is_returned() {
    let (calls, out) = cell(get(), status(404)).await;
    assert_eq!(calls, 1);
    let res = out.unwrap();
    assert_eq!(res.status(), 404);
    assert_eq!(report(&Ok(res)).stop_reason(), StopReason::Final);
}

// --- non-idempotent row ---

#[tokio::test(start_paused = true)]
async fn non_idempotent_not_sent_is_retried() {
    let (calls, out) = cell(post(), Refused).await;
    assert_eq!(calls, 2);
    assert_eq!(out.unwrap().status(), 200);
}

#[tokio::test(start_paused = true)]
async fn non_idempotent_ambiguous_is_suppressed() {
    for first in [Reset, Timeout] {
        let (calls, out) = cell(post(), first).await;
        assert_eq!(calls, 1);
        let err = out.unwrap_err();
        assert!(err.is_ambiguous());
        assert!(err.retry_suppressed());
        assert_eq!(err.stop_reason(), StopReason::SuppressedNotIdempotent);
    }
}

#[tokio::test(start_paused = true)]
async fn non_idempotent_retryable_response_is_suppressed_and_returned() {
    let (calls, out) = cell(post(), Status(429, vec![("retry-after", "0")])).await;
    assert_eq!(calls, 1);
    let res = out.unwrap();
    assert_eq!(res.status(), 429);
    let r = res.extensions().get::<RetryReport>().unwrap();
    assert!(r.retry_suppressed());
    assert_eq!(r.verdict().idempotency(), Idempotency::NonIdempotent);
    assert_eq!(r.verdict().source(), VerdictSource::Method);
}

#[tokio::test(start_paused = true)]
async fn non_idempotent_final_is_returned() {
    let (calls, out) = cell(post(), status(422)).await;
    assert_eq!(calls, 1);
    assert_eq!(report(&out).stop_reason(), StopReason::Final);
}

// --- NoRetry row ---

#[tokio::test(start_paused = true)]
async fn no_retry_is_returned_in_every_column() {
    for first in [Refused, Reset, status(503), status(404)] {
        let (calls, out) = cell(no_retry_get(), first.clone()).await;
        assert_eq!(calls, 1, "{first:?}");
        assert_eq!(
            report(&out).stop_reason(),
            StopReason::NoRetryMarker,
            "{first:?}"
        );
    }
}

/// Host scoping through the layer: the same path is a write on one API, a PUT that may be
/// repeated on another.
#[tokio::test(start_paused = true)]
async fn a_rule_for_one_host_never_suppresses_a_retry_to_another() {
    let policy = || {
        builder().route_for_host(
            "api.a.test",
            Method::PUT,
            "/v1/send/{id}",
            Idempotency::NonIdempotent,
        )
    };
    let put = |host: &str| {
        Request::put(format!("http://{host}/v1/send/m1"))
            .body(String::new())
            .unwrap()
    };
    let script = Script::new([Reset, ok()]);
    let err = run(policy(), &script, put("api.a.test")).await.unwrap_err();
    assert!(err.retry_suppressed());
    assert_eq!(script.count(), 1);
    let script = Script::new([Reset, ok()]);
    let res = run(policy(), &script, put("api.b.test")).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(script.count(), 2);
}
