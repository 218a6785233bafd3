//! What one request records, on paused time against a scripted service: a retry the policy
//! refused is counted once by why, a gRPC call records gRFC A96's per-call histograms, and a
//! request through two layers of this crate is recorded once, by the outer one.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use retry_safety_testing::meters::Meters;
use tower::{service_fn, Layer, ServiceExt};
use tower_retry_safety::{Idempotency, RetryPolicy, RetryReport, StopReason};

/// A retry the failure called for but the policy refused is counted once by why: a
/// `Retry-After` longer than the policy waits, a deadline too near for the next attempt; the
/// refused requests are neither retries nor suppressed writes.
#[tokio::test(start_paused = true)]
async fn refused_retries_are_counted_by_why() {
    let meters = Meters::new();
    let policy = RetryPolicy::builder()
        .max_retry_after(Duration::from_secs(10))
        .meter(meters.meter())
        .build()
        .expect("policy");
    let svc = policy.layer(service_fn(|req: Request<String>| async move {
        let wait = if req.uri().path() == "/long" {
            "3600"
        } else {
            "1"
        };
        Response::builder()
            .status(StatusCode::SERVICE_UNAVAILABLE)
            .header("retry-after", wait)
            .body(String::new())
    }));
    let mut reports = Vec::new();
    for path in ["long", "long"] {
        let req = Request::get(format!("http://api.example/{path}?token=s3cr3t"))
            .body(String::new())
            .expect("request");
        let res = svc.clone().oneshot(req).await.expect("a response");
        reports.push(RetryReport::of(&res).cloned().expect("a report"));
    }
    let deadline = RetryPolicy::builder()
        .deadline(Duration::from_millis(500))
        .meter(meters.meter())
        .build()
        .expect("policy");
    let svc = deadline.layer(service_fn(|_req: Request<String>| async move {
        Response::builder()
            .status(StatusCode::SERVICE_UNAVAILABLE)
            .header("retry-after", "1")
            .body(String::new())
    }));
    let req = Request::get("http://api.example/short")
        .body(String::new())
        .expect("request");
    let res = svc.oneshot(req).await.expect("a response");
    reports.push(RetryReport::of(&res).cloned().expect("a report"));

    let stops: Vec<_> = reports.iter().map(RetryReport::stop_reason).collect();
    assert_eq!(
        stops,
        [
            StopReason::RetryAfterTooLong,
            StopReason::RetryAfterTooLong,
            StopReason::Deadline
        ]
    );
    let got = meters.read();
    let refused = |why: &str| {
        got.sum_where(
            "retry_safety.client.retries.refused",
            "retry_safety.stop_reason",
            why,
        )
    };
    assert_eq!(refused("retry-after-too-long"), 2);
    assert_eq!(refused("deadline"), 1);
    assert_eq!(got.total("retry_safety.client.retries.refused"), 3);
    assert_eq!(got.total("retry_safety.client.retries"), 0);
    assert_eq!(got.total("retry_safety.client.writes.suppressed"), 0);
    for (_, attributes) in got.all_attributes() {
        assert_eq!(attributes["server.address"], "api.example");
    }
}

/// gRPC calls also record gRFC A96's per-call histograms, named by `grpc.method` (a method
/// the policy knows: issue 41 item 9 made unknown ones `other`): a call
/// resent twice after UNAVAILABLE records its retries once, and a call answered at once
/// records none (A96 leaves zeros out).
#[tokio::test(start_paused = true)]
async fn grpc_calls_record_the_a96_retry_histograms() {
    use std::sync::atomic::{AtomicU32, Ordering};

    let meters = Meters::new();
    // The route makes `Get` a method the policy knows: its own `grpc.method` value.
    let policy = RetryPolicy::builder()
        .backoff(Duration::from_millis(5), Duration::from_millis(5))
        .route(Method::POST, "/lab.v1.Ledger/Get", Idempotency::Idempotent)
        .meter(meters.meter())
        .build()
        .expect("policy");
    let calls = Arc::new(AtomicU32::new(0));
    let seen = calls.clone();
    let svc = policy.layer(service_fn(move |req: Request<String>| {
        let n = seen.fetch_add(1, Ordering::SeqCst);
        let flaky = req.uri().path().ends_with("/Get");
        async move {
            let status = if flaky && n < 2 { "14" } else { "0" };
            Response::builder()
                .header("content-type", "application/grpc")
                .header("grpc-status", status)
                .body(String::new())
        }
    }));
    let call = |method: &str| {
        let mut req = Request::post(format!("http://svc/lab.v1.Ledger/{method}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(String::new())
            .expect("request");
        req.extensions_mut().insert(Idempotency::Idempotent);
        req
    };
    let res = svc.clone().oneshot(call("Get")).await.expect("a response");
    let report = RetryReport::of(&res).cloned().expect("a report");
    assert_eq!(report.attempts(), 3, "{report:?}");
    let res = svc.oneshot(call("List")).await.expect("a response");
    assert_eq!(RetryReport::of(&res).map(RetryReport::attempts), Some(1));

    let got = meters.read();
    let points = got.u64_histogram_points("grpc.client.call.retries");
    let methods: Vec<_> = points
        .iter()
        .map(|(a, _)| a["grpc.method"].clone())
        .collect();
    assert_eq!(methods, ["lab.v1.Ledger/Get"]);
    assert_eq!(got.u64_histogram("grpc.client.call.retries"), (1, 2));
    assert_eq!(
        got.u64_histogram("grpc.client.call.transparent_retries"),
        (0, 0)
    );
    assert_eq!(got.u64_histogram("grpc.client.call.hedges"), (0, 0));
    assert_eq!(got.f64_histogram("grpc.client.call.retry_delay").0, 1);
    assert_eq!(got.unit("grpc.client.call.retry_delay"), "s");
    // The crate's own instruments count the same calls.
    assert_eq!(got.u64_histogram("retry_safety.client.attempts"), (2, 4));
    assert_eq!(got.total("retry_safety.client.retries"), 2);
}

/// Two layers of this crate, one over the other, both with the meter: the outer one owns the
/// request and records it once (the inner one, whose attempts the outer one makes, records
/// nothing). A request that shows no host records no `server.address`.
#[tokio::test(start_paused = true)]
async fn a_request_through_two_layers_is_recorded_once() {
    use std::sync::atomic::{AtomicU32, Ordering};

    let meters = Meters::new();
    // The route makes `Get` a method the policy knows: its own `grpc.method` value.
    let policy = RetryPolicy::builder()
        .backoff(Duration::from_millis(5), Duration::from_millis(5))
        .route(Method::POST, "/lab.v1.Ledger/Get", Idempotency::Idempotent)
        .meter(meters.meter())
        .build()
        .expect("policy");
    let calls = Arc::new(AtomicU32::new(0));
    let seen = calls.clone();
    let handler = service_fn(move |_req: Request<String>| {
        let n = seen.fetch_add(1, Ordering::SeqCst);
        async move {
            let status = if n == 0 { 503 } else { 200 };
            Response::builder().status(status).body(String::new())
        }
    });
    let svc = policy.layer(policy.layer(handler));
    let req = Request::get("/v1/items?token=s3cr3t")
        .body(String::new())
        .expect("request");
    let res = svc.oneshot(req).await.expect("a response");
    let report = RetryReport::of(&res).cloned().expect("a report");
    assert_eq!(report.attempts(), 2, "{report:?}");

    let got = meters.read();
    assert_eq!(got.u64_histogram("retry_safety.client.attempts"), (1, 2));
    assert_eq!(
        got.sum_where(
            "retry_safety.client.retries",
            "retry_safety.failure_class",
            "retryable-response"
        ),
        1
    );
    assert_eq!(got.total("retry_safety.client.retries"), 1);
    for (name, attributes) in got.all_attributes() {
        assert!(
            !attributes.contains_key("server.address"),
            "{name}: {attributes:?}"
        );
    }
}
