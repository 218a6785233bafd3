//! The layer over a scripted inner service, with paused tokio time: stacked layers that never
//! compound, cancel safety during a backoff, the inner service's readiness, and a total timeout
//! outside with a per-attempt timeout inside.

use std::time::Duration;

use crate::scripted_layer::{builder, get, run};
use http::{Request, Response};
use retry_safety_testing::script::{ok, status, Reset, Script, Status};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_retry_safety::{RetryReport, StopReason};

// --- stacked layers never compound ---

#[tokio::test(start_paused = true)]
async fn stacked_layers_make_at_most_max_retries_plus_one_attempts() {
    let script = Script::new(std::iter::repeat_n(status(503), 20));
    let outer = builder().max_retries(3).build().unwrap();
    let inner = builder().max_retries(3).build().unwrap();
    let svc = ServiceBuilder::new()
        .layer(outer)
        .layer(inner)
        .service(script.clone());
    let res = svc.oneshot(get()).await.unwrap();
    assert_eq!(script.count(), 4);
    let r = res.extensions().get::<RetryReport>().unwrap();
    assert_eq!(r.attempts(), 4);
    assert_eq!(r.stop_reason(), StopReason::RetriesExhausted);
}

#[tokio::test(start_paused = true)]
async fn stacked_layers_errors_are_not_double_wrapped() {
    let script = Script::new(std::iter::repeat_n(Reset, 10));
    let svc = ServiceBuilder::new()
        .layer(builder().max_retries(2).build().unwrap())
        .layer(builder().max_retries(2).build().unwrap())
        .service(script.clone());
    let err = svc.oneshot(get()).await.unwrap_err();
    assert_eq!(script.count(), 3);
    let source = std::error::Error::source(&err).unwrap();
    assert!(
        source.downcast_ref::<std::io::Error>().is_some(),
        "{source:?}"
    );
}

// --- cancel safety ---

#[tokio::test(start_paused = true)]
async fn dropping_the_future_during_backoff_sends_nothing_more() {
    let script = Script::new([Status(503, vec![("retry-after", "10")]), ok()]);
    let svc = builder().build().unwrap().layer(script.clone());
    let fut = svc.oneshot(get());
    // Let the first attempt run and the layer start its 10 s wait, then give up at 1 s.
    let out = tokio::time::timeout(Duration::from_secs(1), fut).await;
    assert!(out.is_err());
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(script.count(), 1);
}

// --- readiness ---

#[tokio::test(start_paused = true)]
async fn each_retry_waits_for_the_inner_service_to_be_ready() {
    // The script panics on a call without a prior Ready; Pending polls must be waited out.
    let script = Script::new([Reset, Reset, ok()]).pending_before_ready(3);
    let out = run(builder().max_retries(2), &script, get()).await;
    assert_eq!(out.unwrap().status(), 200);
    assert_eq!(script.count(), 3);
}

#[tokio::test(start_paused = true)]
async fn readiness_failure_before_a_retry_is_an_error_with_the_history() {
    let script = Script::new([status(503), ok()]).fail_ready_after_first();
    let mut svc = builder().build().unwrap().layer(script.clone());
    let err = ServiceExt::<Request<String>>::ready(&mut svc)
        .await
        .unwrap()
        .call(get())
        .await
        .unwrap_err();
    assert_eq!(script.count(), 1);
    assert_eq!(err.stop_reason(), StopReason::ServiceNotReady);
    assert_eq!(err.attempts(), 1);
    // The first attempt got a response: the request reached the server.
    assert!(err.is_ambiguous());
}

/// An inner service whose readiness fails.
#[derive(Clone, Debug)]
struct FailReady;

impl Service<Request<String>> for FailReady {
    type Response = Response<String>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Response<String>, std::io::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Err(std::io::Error::other("pool closed")))
    }

    fn call(&mut self, _: Request<String>) -> Self::Future {
        std::future::ready(Err(std::io::Error::other("called without readiness")))
    }
}

#[tokio::test]
async fn inner_poll_ready_error_is_not_ready() {
    let mut svc = builder().build().unwrap().layer(FailReady);
    let err = ServiceExt::<Request<String>>::ready(&mut svc)
        .await
        .unwrap_err();
    assert_eq!(err.attempts(), 0);
    assert_eq!(err.stop_reason(), StopReason::ServiceNotReady);
    assert!(err.is_not_sent());
    assert!(err.to_string().contains("no request was handed to it"));
}

// --- composition: a total timeout outside, a per-attempt timeout inside ---

#[tokio::test(start_paused = true)]
async fn total_timeout_outside_and_per_attempt_timeout_inside() {
    let script = Script::new([Status(503, vec![("retry-after", "10")]), ok()]);
    let svc = ServiceBuilder::new()
        .timeout(Duration::from_secs(3)) // total, for all attempts
        .layer(builder().build().unwrap())
        .timeout(Duration::from_secs(1)) // per attempt
        .service(script.clone());
    let err = svc.oneshot(get()).await.unwrap_err();
    // The outer timeout fired during the 10 s wait; nothing more was sent.
    assert!(err.is::<tower::timeout::error::Elapsed>(), "{err:?}");
    assert_eq!(script.count(), 1);
}
