//! The layer's `tracing` events: debug per retry, warn per suppressed retry and per retry
//! refused though the failure called for one, with OpenTelemetry's HTTP field names and
//! nothing from the query string, the headers or the body.

use std::time::Duration;

use http::Request;
use retry_safety_testing::logs::{block_on, capture};
use retry_safety_testing::script::{ok, status, Reset, Script};
use tower::{Layer, ServiceExt};
use tower_retry_safety::RetryPolicy;

fn policy() -> RetryPolicy {
    RetryPolicy::builder()
        .jitter(false)
        .backoff(Duration::from_millis(100), Duration::from_secs(1))
        .no_budget()
        .build()
        .unwrap()
}

#[test]
fn a_retry_is_a_debug_event_with_fields() {
    let (logs, ()) = capture(|| {
        block_on(async {
            let req = Request::get("http://h/v1/items/7?token=sekrit")
                .header("authorization", "Bearer sekrit")
                .body(String::new())
                .unwrap();
            policy()
                .layer(Script::new([status(503), ok()]))
                .oneshot(req)
                .await
                .unwrap();
        })
    });
    let line = logs
        .lines()
        .find(|l| l.contains("retrying request"))
        .expect(&logs);
    assert!(line.trim_start().starts_with("DEBUG"), "{line}");
    for field in [
        "http.request.method=GET",
        "url.path=\"/v1/items/7\"",
        "attempt=1",
        "http.request.resend_count=0",
        "error.type=\"retryable-response\"",
        "http.response.status_code=503",
        "delay_ms=100",
    ] {
        assert!(line.contains(field), "{field} missing in {line}");
    }
    assert!(!logs.contains("sekrit"), "{logs}");
}

#[test]
fn a_suppressed_retry_is_a_warn_event_with_fields() {
    let (logs, ()) = capture(|| {
        block_on(async {
            let req = Request::post("http://h/v1/tools/execute?to=a@example.com")
                .header("x-request-id", "req-1")
                .header("cookie", "session=sekrit")
                .body("{\"card\":\"4242\"}".to_owned())
                .unwrap();
            policy()
                .layer(Script::new([Reset]))
                .oneshot(req)
                .await
                .unwrap_err();
        })
    });
    let line = logs
        .lines()
        .find(|l| l.contains("retry suppressed"))
        .expect(&logs);
    assert!(line.trim_start().starts_with("WARN"), "{line}");
    for field in [
        "http.request.method=POST",
        "url.path=\"/v1/tools/execute\"",
        "attempt=1",
        "error.type=\"ambiguous\"",
        "verdict_source=\"method\"",
        "request_id=\"req-1\"",
    ] {
        assert!(line.contains(field), "{field} missing in {line}");
    }
    for leak in ["sekrit", "4242", "a@example.com"] {
        assert!(!logs.contains(leak), "{leak} in {logs}");
    }
}

/// A retry the failure called for but the budget refused: an operator sees it.
#[test]
fn a_retry_refused_by_the_budget_is_a_warn_event() {
    let (logs, ()) = capture(|| {
        block_on(async {
            // A budget with no floor and no deposits yet: the first retry is refused.
            let policy = RetryPolicy::builder()
                .tps_budget(Duration::from_secs(1), 0, 0.0)
                .build()
                .unwrap();
            let req = Request::get("http://h/v1/items/7")
                .body(String::new())
                .unwrap();
            policy
                .layer(Script::new([status(503), ok()]))
                .oneshot(req)
                .await
                .unwrap();
        })
    });
    let line = logs
        .lines()
        .find(|l| l.contains("retry refused"))
        .expect(&logs);
    assert!(line.trim_start().starts_with("WARN"), "{line}");
    assert!(line.contains("reason=\"budget\""), "{line}");
}
