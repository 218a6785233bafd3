//! The policy owns the time: a deadline that also cuts the attempt in flight and a per-attempt
//! timeout, each ending in this crate's typed error; per-call options that override
//! `max_retries`, the deadline and the per-attempt timeout for one request. Paused time for
//! the timing, the fault server for side effects.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use retry_safety_testing::fault_server::FaultServer;
use retry_safety_testing::script::{ok, Reset, Script};
use tokio::time::Instant;
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_retry_safety::{
    FailureClass, NoRetry, RequestOptions, RetryPolicy, RetryPolicyBuilder, RetryReport, StopReason,
};

fn builder() -> RetryPolicyBuilder {
    RetryPolicy::builder()
        .jitter(false)
        .backoff(Duration::from_millis(100), Duration::from_secs(1))
        .max_retries(5)
        .no_budget()
}

/// An inner service whose n-th call takes `delays[n]` ms (the last one repeats), then 200.
fn slow(
    delays: &'static [u64],
) -> (
    impl tower::Service<
            Request<String>,
            Response = Response<String>,
            Error = Infallible,
            Future = impl Send,
        > + Clone,
    Arc<AtomicU32>,
) {
    let calls = Arc::new(AtomicU32::new(0));
    let seen = calls.clone();
    let svc = tower::service_fn(move |_req: Request<String>| {
        let n = seen.fetch_add(1, Ordering::SeqCst) as usize;
        let delay = delays[n.min(delays.len() - 1)];
        async move {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            Ok::<_, Infallible>(Response::new(String::from("ok")))
        }
    });
    (svc, calls)
}

fn post() -> Request<String> {
    Request::post("http://api.test/v1/messages/send")
        .body("{}".to_owned())
        .unwrap()
}

fn get() -> Request<String> {
    Request::get("http://api.test/v1/things/1")
        .body(String::new())
        .unwrap()
}

fn with(mut req: Request<String>, options: RequestOptions) -> Request<String> {
    req.extensions_mut().insert(options);
    req
}

#[tokio::test(start_paused = true)]
async fn a_deadline_cuts_a_slow_write_into_an_ambiguous_typed_error() {
    let (svc, calls) = slow(&[10_000]);
    let layer = builder().deadline(Duration::from_secs(1)).build().unwrap();
    let start = Instant::now();
    let err = layer.layer(svc).oneshot(post()).await.unwrap_err();
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert!(err.is_ambiguous(), "the write may have been applied");
    assert!(err.is_timeout());
    assert_eq!(err.attempts(), 1);
    assert_eq!(err.stop_reason(), StopReason::SuppressedNotIdempotent);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(err.to_string().contains("POST /v1/messages/send"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn attempts_are_cut_by_their_timeout_and_the_last_by_the_deadline() {
    // Cut at 300 ms, wait 100; 400–700 cut, wait 200; 900–1000 cut by the deadline.
    let (svc, calls) = slow(&[10_000]);
    let layer = builder()
        .deadline(Duration::from_secs(1))
        .attempt_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let start = Instant::now();
    let err = layer.layer(svc).oneshot(get()).await.unwrap_err();
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(err.stop_reason(), StopReason::Deadline);
    assert!(err.is_timeout());
    let report = err.report().unwrap();
    let classes: Vec<_> = report.attempt_outcomes().map(|a| a.class()).collect();
    assert_eq!(classes, [FailureClass::Ambiguous; 3]);
}

#[tokio::test(start_paused = true)]
async fn an_attempt_timeout_retries_a_read_into_its_answer() {
    let (svc, calls) = slow(&[10_000, 0]);
    let layer = builder()
        .attempt_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let start = Instant::now();
    let res = layer.layer(svc).oneshot(get()).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(400));
    assert_eq!(res.status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let report = res.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.attempts(), 2);
}

#[tokio::test(start_paused = true)]
async fn per_call_max_retries_zero_sends_once_like_no_retry() {
    for marker in ["options", "no-retry"] {
        let script = Script::new([Reset, ok()]);
        let mut req = get();
        if marker == "options" {
            req.extensions_mut()
                .insert(RequestOptions::new().max_retries(0));
        } else {
            req.extensions_mut().insert(NoRetry);
        }
        let err = builder()
            .build()
            .unwrap()
            .layer(script.clone())
            .oneshot(req)
            .await
            .unwrap_err();
        assert_eq!(script.count(), 1, "{marker}");
        assert_eq!(err.attempts(), 1, "{marker}");
    }
    // Per call, more retries than the policy gives.
    let script = Script::new([Reset, Reset, Reset, ok()]);
    let res = builder()
        .max_retries(1)
        .build()
        .unwrap()
        .layer(script.clone())
        .oneshot(with(get(), RequestOptions::new().max_retries(3)))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(script.count(), 4);
}

#[tokio::test(start_paused = true)]
async fn per_call_deadline_and_attempt_timeout_override_the_policy() {
    let policy = builder()
        .deadline(Duration::from_secs(60))
        .attempt_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let (svc, calls) = slow(&[10_000]);
    let start = Instant::now();
    let err = policy
        .layer(svc)
        .oneshot(with(
            post(),
            RequestOptions::new().deadline(Duration::from_millis(500)),
        ))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), Duration::from_millis(500));
    assert!(err.is_ambiguous() && err.is_timeout());
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let (svc, calls) = slow(&[10_000, 0]);
    let res = policy
        .layer(svc)
        .oneshot(with(
            get(),
            RequestOptions::new().attempt_timeout(Duration::from_millis(200)),
        ))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// The README's "Use" stack: timeouts on the policy, so a per-call `attempt_timeout` can
/// lengthen the policy's. A tower `.timeout()` under the layer cannot be lengthened by it:
/// the shorter wins (the README says so; this is its control).
#[tokio::test(start_paused = true)]
async fn a_per_call_attempt_timeout_lengthens_the_policys_but_not_a_tower_timeout_under_it() {
    let slow_call = || {
        with(
            get(),
            RequestOptions::new().attempt_timeout(Duration::from_secs(2)),
        )
    };

    let policy = builder()
        .attempt_timeout(Duration::from_millis(300))
        .max_retries(0)
        .build()
        .unwrap();
    let (svc, calls) = slow(&[1_000]);
    let start = Instant::now();
    let res = ServiceBuilder::new()
        .layer(policy)
        .service(svc)
        .oneshot(slow_call())
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(start.elapsed(), Duration::from_millis(1_000));
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let policy = builder().max_retries(0).build().unwrap();
    let (svc, calls) = slow(&[1_000]);
    let start = Instant::now();
    let err = ServiceBuilder::new()
        .layer(policy)
        .timeout(Duration::from_millis(300))
        .service(svc)
        .oneshot(slow_call())
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn settings_that_cannot_work_fail_build() {
    let err = builder()
        .attempt_timeout(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(err.setting_name(), "attempt_timeout");
}

/// Through real sockets: the handler applies, then is slow; the deadline cuts the attempt.
/// The caller keeps the typed error (not a bare `Elapsed`), and the write ran once.
#[tokio::test]
async fn a_deadline_over_hyper_util_keeps_the_typed_error_and_the_write_ran_once() {
    let server = FaultServer::start().await;
    let policy = builder()
        .deadline(Duration::from_millis(300))
        .build()
        .unwrap();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let svc = ServiceBuilder::new().layer(policy).service(client);
    let req = Request::post(server.url("slow-write"))
        .header("x-handler-delay-ms", "1500")
        .header("x-request-id", "req-7")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let err = svc.oneshot(req).await.unwrap_err();
    assert!(err.is_ambiguous());
    assert!(err.is_timeout());
    assert_eq!(err.request_id(), Some("req-7"));
    // The handler finishes on its own; the write ran once.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(server.applied("slow-write"), 1);
}

#[cfg(feature = "reqwest-middleware")]
#[tokio::test]
async fn reqwest_per_call_options_and_deadline() {
    use tower_retry_safety::RetrySafetyMiddleware;

    let server = FaultServer::start().await;
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetrySafetyMiddleware::new(builder().build().unwrap()))
        .build();
    // A per-call deadline cuts a slow write: typed, ambiguous, applied once.
    let err = client
        .post(server.url("reqwest-slow"))
        .header("x-handler-delay-ms", "1500")
        .with_extension(RequestOptions::new().deadline(Duration::from_millis(300)))
        .send()
        .await
        .unwrap_err();
    let reqwest_middleware::Error::Middleware(inner) = &err else {
        panic!("expected the adapter's error, got {err:?}");
    };
    let ours = inner.downcast_ref::<tower_retry_safety::Error>().unwrap();
    assert!(ours.is_ambiguous() && ours.is_timeout());
    assert_eq!(ours.attempts(), 1);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(server.applied("reqwest-slow"), 1);

    // A per-call attempt timeout retries a read whose first attempt is slow.
    let res = client
        .get(server.url("reqwest-read"))
        .header("x-fault", "slow-after-apply")
        .with_extension(RequestOptions::new().attempt_timeout(Duration::from_millis(300)))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.extensions().get::<RetryReport>().unwrap().attempts(), 2);
}
