//! What the caller knows about its API: statuses that prove nothing was applied, and a hook
//! that classifies responses before the policy's own rules. Through the layer (scripted,
//! paused time) and against the fault server (side effects counted).

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use retry_safety_testing::fault_server::{Fault, FaultServer};
use retry_safety_testing::script::{ok, status, Script, Status};
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_retry_safety::{FailureClass, RetryPolicy, RetryPolicyBuilder, StopReason};

fn builder() -> RetryPolicyBuilder {
    RetryPolicy::builder()
        .jitter(false)
        .backoff(Duration::from_millis(100), Duration::from_secs(1))
        .no_budget()
}

fn post() -> Request<String> {
    Request::post("http://api.test/v1/tools/execute")
        .body("{}".to_owned())
        .unwrap()
}

fn get() -> Request<String> {
    Request::get("http://api.test/v1/tools")
        .body(String::new())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_status_that_proves_nothing_was_applied_retries_a_write() {
    let policy = builder()
        .not_applied_statuses([StatusCode::TOO_MANY_REQUESTS])
        .build()
        .unwrap();
    let script = Script::new([Status(429, vec![("retry-after", "2")]), ok()]);
    let res = policy.layer(script.clone()).oneshot(post()).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(script.call_times_ms(), [0, 2000], "Retry-After honoured");
    // Other retryable statuses stay suppressed for a write.
    let script = Script::new([status(503), ok()]);
    let res = policy.layer(script.clone()).oneshot(post()).await.unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(script.count(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_hook_speaks_first_and_can_never_make_a_maybe_applied_write_retryable() {
    let policy = builder()
        .classify_responses_with(|status, headers| {
            if headers.get("x-not-processed").is_some() {
                Some(FailureClass::NotSent)
            } else if status == 200 && headers.get("x-rate-limited").is_some() {
                Some(FailureClass::RetryableResponse)
            } else if status == 503 {
                Some(FailureClass::Final)
            } else {
                None
            }
        })
        .build()
        .unwrap();
    // Proof of nothing applied: a write is retried.
    let script = Script::new([Status(409, vec![("x-not-processed", "1")]), ok()]);
    let res = policy.layer(script.clone()).oneshot(post()).await.unwrap();
    assert_eq!((res.status(), script.count()), (StatusCode::OK, 2));
    // A 200 that says "rate limited": a read is retried, a write is not.
    let limited = || Script::new([Status(200, vec![("x-rate-limited", "1")]), status(201)]);
    let script = limited();
    let res = policy.layer(script.clone()).oneshot(get()).await.unwrap();
    assert_eq!((res.status(), script.count()), (StatusCode::CREATED, 2));
    let script = limited();
    let res = policy.layer(script.clone()).oneshot(post()).await.unwrap();
    assert_eq!((res.status(), script.count()), (StatusCode::OK, 1));
    let report = res
        .extensions()
        .get::<tower_retry_safety::RetryReport>()
        .unwrap();
    assert_eq!(report.stop_reason(), StopReason::SuppressedNotIdempotent);
    // Final by the hook, though 503 is in the retry set.
    let script = Script::new([status(503), ok()]);
    let res = policy.layer(script.clone()).oneshot(get()).await.unwrap();
    assert_eq!(
        (res.status(), script.count()),
        (StatusCode::SERVICE_UNAVAILABLE, 1)
    );
}

#[test]
fn a_success_status_cannot_prove_nothing_was_applied() {
    let err = builder()
        .not_applied_statuses([StatusCode::OK])
        .build()
        .unwrap_err();
    assert_eq!(err.setting_name(), "not_applied_statuses");
}

/// Against the fault server: the 429 it answers before applying is retried into one write; a
/// 503 after apply is never retried.
#[tokio::test]
async fn the_proof_retries_a_429d_write_once_more_and_never_a_503_after_apply() {
    let server = FaultServer::start().await;
    let policy = RetryPolicy::builder()
        .not_applied_statuses([StatusCode::TOO_MANY_REQUESTS])
        .backoff(Duration::from_millis(5), Duration::from_millis(20))
        .no_budget()
        .build()
        .unwrap();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let svc = ServiceBuilder::new().layer(policy).service(client);
    for (op, fault, expect, attempts) in [
        ("rate-limited", Fault::TooManyRequestsBeforeApply, 200, 2),
        ("unavailable", Fault::UnavailableAfterApply, 503, 1),
    ] {
        let req = Request::post(server.url(op))
            .header("x-fault", fault.name())
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let res = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), expect, "{op}");
        assert_eq!(server.stats(op).attempts, attempts, "{op}");
        assert_eq!(server.applied(op), 1, "{op}");
    }
}
