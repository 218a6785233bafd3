//! The reqwest-middleware adapter against the same fault server as the layer, with
//! reqwest-retry's `RetryTransientMiddleware` beside it as the reference that the faults are
//! real (it applies writes twice).
#![cfg(feature = "reqwest-middleware")]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Extensions, Method};
use reqwest::{Request, Response, StatusCode};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use retry_safety_testing::fault_server::{refused_addr, Fault, FaultServer};
use tower::{Layer, ServiceExt};
use tower_retry_safety::service::NotReplayable;
use tower_retry_safety::{
    FailureClass, Idempotency, NoRetry, RetryPolicy, RetryPolicyBuilder, RetryReport,
    RetrySafetyMiddleware, StopReason,
};

// Well under the fault server's 800 ms slow response, well over a loaded machine's round trip.
const PER_ATTEMPT: Duration = Duration::from_millis(400);

fn policy() -> RetryPolicyBuilder {
    RetryPolicy::builder()
        .max_retries(3)
        .backoff(Duration::from_millis(5), Duration::from_millis(50))
        .no_budget()
}

fn reqwest_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(PER_ATTEMPT)
        .build()
        .unwrap()
}

fn ours(policy: RetryPolicy) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest_client())
        .with(RetrySafetyMiddleware::new(policy))
        .build()
}

fn reference() -> ClientWithMiddleware {
    let p = reqwest_retry::policies::ExponentialBackoff::builder()
        .retry_bounds(Duration::from_millis(5), Duration::from_millis(50))
        .build_with_max_retries(3);
    ClientBuilder::new(reqwest_client())
        .with(reqwest_retry::RetryTransientMiddleware::new_with_policy(p))
        .build()
}

async fn send(
    client: &ClientWithMiddleware,
    method: Method,
    url: &str,
    fault: Fault,
) -> reqwest_middleware::Result<Response> {
    client
        .request(method, url)
        .header("x-fault", fault.name())
        .body("{\"to\":\"a@example.com\"}")
        .send()
        .await
}

fn our_error(e: &reqwest_middleware::Error) -> &tower_retry_safety::Error {
    match e {
        reqwest_middleware::Error::Middleware(e) => e
            .downcast_ref::<tower_retry_safety::Error>()
            .expect("the middleware's error"),
        other => panic!("expected a middleware error, got {other:?}"),
    }
}

#[tokio::test]
async fn no_write_applied_twice_every_read_recovered_and_the_reference_duplicates() {
    let ours_server = FaultServer::start().await;
    let ref_server = FaultServer::start().await;
    let ours = ours(policy().build().unwrap());
    let reference = reference();

    for fault in Fault::ALL {
        let op = format!("post-{}", fault.name());
        let out = send(&ours, Method::POST, &ours_server.url(&op), fault).await;
        assert_eq!(ours_server.applied(&op), u32::from(fault.applies()), "{op}");
        assert_eq!(ours_server.stats(&op).attempts, 1, "{op}");
        match fault {
            Fault::None => assert_eq!(out.unwrap().status(), 200),
            Fault::DropAfterApply | Fault::SlowAfterApply => {
                let err = out.unwrap_err();
                let e = our_error(&err);
                assert!(e.is_ambiguous() && e.retry_suppressed(), "{op}: {e}");
                assert_eq!(e.is_timeout(), fault == Fault::SlowAfterApply, "{op}: {e}");
                assert_eq!(e.failure_class(), Some(FailureClass::Ambiguous));
            }
            _ => {
                let res = out.unwrap();
                let report = res.extensions().get::<RetryReport>().unwrap();
                assert!(report.retry_suppressed(), "{op}");
            }
        }

        // The reference retries the same write: the faults are real.
        send(&reference, Method::POST, &ref_server.url(&op), fault)
            .await
            .ok();
        let expected = match fault {
            Fault::DropAfterApply | Fault::SlowAfterApply | Fault::UnavailableAfterApply => 2,
            _ => 1,
        };
        assert_eq!(ref_server.applied(&op), expected, "reference {op}");
    }
    assert_eq!(ours_server.applied_twice(), 0);
    assert_eq!(ref_server.applied_twice(), 3);

    for fault in Fault::ALL {
        let op = format!("get-{}", fault.name());
        let res = send(&ours, Method::GET, &ours_server.url(&op), fault)
            .await
            .unwrap_or_else(|e| panic!("{op}: {e}"));
        assert_eq!(res.status(), StatusCode::OK, "{op}");
        let attempts = res.extensions().get::<RetryReport>().unwrap().attempts();
        let expected = if fault == Fault::None { 1 } else { 2 };
        assert_eq!(attempts, expected, "{op}");
        assert_eq!(ours_server.stats(&op).attempts, expected, "{op}");
    }
}

#[tokio::test]
async fn markers_are_honoured() {
    let server = FaultServer::start().await;
    let client = ours(policy().build().unwrap());

    let res = client
        .get(server.url("get-no-retry"))
        .header("x-fault", Fault::InternalErrorBeforeApply.name())
        .with_extension(NoRetry)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 500);
    assert_eq!(server.stats("get-no-retry").attempts, 1);
    let report = res.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.stop_reason(), StopReason::NoRetryMarker);

    let res = client
        .post(server.url("post-marked-idempotent"))
        .header("x-fault", Fault::UnavailableAfterApply.name())
        .with_extension(Idempotency::Idempotent)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(server.stats("post-marked-idempotent").attempts, 2);

    let err = client
        .get(server.url("get-marked-write"))
        .header("x-fault", Fault::DropAfterApply.name())
        .with_extension(Idempotency::NonIdempotent)
        .send()
        .await
        .unwrap_err();
    assert!(our_error(&err).retry_suppressed());
    assert_eq!(server.stats("get-marked-write").attempts, 1);
}

#[tokio::test]
async fn route_rules_apply() {
    let server = FaultServer::start().await;
    let client = ours(
        policy()
            .route(Method::POST, "/ops/{op}/search", Idempotency::Idempotent)
            .build()
            .unwrap(),
    );
    let res = send(
        &client,
        Method::POST,
        &server.url("q/search"),
        Fault::DropAfterApply,
    )
    .await
    .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(server.stats("q/search").attempts, 2);
}

async fn put_stream(client: &ClientWithMiddleware, server: &FaultServer, fault: Fault) -> Response {
    let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
        Ok(Bytes::from_static(b"chunk-1,")),
        Ok(Bytes::from_static(b"chunk-2")),
    ];
    client
        .put(server.url("put-stream"))
        .header("x-fault", fault.name())
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_streaming_body_is_recorded_and_retried_intact() {
    for fault in [Fault::UnavailableAfterApply, Fault::DropAfterApply] {
        let server = FaultServer::start().await;
        let client = ours(policy().build().unwrap());
        let res = put_stream(&client, &server, fault).await;
        assert_eq!(res.status(), 200, "{fault:?}");
        assert_eq!(server.stats("put-stream").attempts, 2, "{fault:?}");
        assert_eq!(server.stats("put-stream").body_len, 15, "{fault:?}");
        assert_eq!(RetryReport::of_reqwest(&res).unwrap().attempts(), 2);
    }
}

#[tokio::test]
async fn a_streaming_body_over_the_replay_buffer_is_sent_once() {
    let server = FaultServer::start().await;
    let client = ours(policy().replay_buffer(8).build().unwrap());
    let res = put_stream(&client, &server, Fault::UnavailableAfterApply).await;
    assert_eq!(res.status(), 503);
    assert_eq!(server.stats("put-stream").attempts, 1);
    assert_eq!(server.stats("put-stream").body_len, 15);
    let report = res.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.stop_reason(), StopReason::BodyNotReplayable);
    assert_eq!(
        report.body_not_replayable(),
        Some(NotReplayable::OverLimit { limit: 8 })
    );
}

/// Sends the first attempt of each request to a port where nothing listens: a real refused
/// connection, then the real server.
struct FirstAttemptRefused(SocketAddr);

#[async_trait::async_trait]
impl Middleware for FirstAttemptRefused {
    async fn handle(
        &self,
        mut req: Request,
        ext: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        #[derive(Clone)]
        struct Seen;
        if ext.get::<Seen>().is_none() {
            ext.insert(Seen);
            req.url_mut().set_port(Some(self.0.port())).unwrap();
        }
        next.run(req, ext).await
    }
}

#[tokio::test]
async fn a_post_refused_on_its_first_attempt_is_retried_and_applied_once() {
    let server = FaultServer::start().await;
    let client = ClientBuilder::new(reqwest_client())
        .with(RetrySafetyMiddleware::new(policy().build().unwrap()))
        .with(FirstAttemptRefused(refused_addr().await))
        .build();
    let res = send(
        &client,
        Method::POST,
        &server.url("post-refused"),
        Fault::None,
    )
    .await
    .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(server.applied("post-refused"), 1);
    let classes: Vec<_> = res
        .extensions()
        .get::<RetryReport>()
        .unwrap()
        .attempt_outcomes()
        .map(|r| r.class())
        .collect();
    assert_eq!(classes, [FailureClass::NotSent, FailureClass::Final]);
}

#[tokio::test]
async fn refused_every_time_is_a_not_sent_error_with_a_clean_chain() {
    let addr = refused_addr().await;
    let client = ours(policy().max_retries(1).build().unwrap());
    let err = send(
        &client,
        Method::POST,
        &format!("http://{addr}/ops/x?token=t0p"),
        Fault::None,
    )
    .await
    .unwrap_err();
    let e = our_error(&err);
    assert!(e.is_not_sent());
    assert_eq!(e.attempts(), 2);
    assert!(!e.to_string().contains("t0p"));
    let source = std::error::Error::source(e).unwrap();
    assert!(source
        .downcast_ref::<reqwest::Error>()
        .unwrap()
        .is_connect());
}

#[tokio::test]
async fn one_policy_one_budget_for_tower_and_reqwest() {
    // One retry in the whole budget, and deposits earn none.
    let policy = policy()
        .tps_budget(Duration::from_secs(1), 1, 0.0)
        .build()
        .unwrap();
    let server = FaultServer::start().await;

    let tower_svc = policy.clone().layer(
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http::<http_body_util::Full<Bytes>>(),
    );
    let req = http::Request::get(server.url("tower-get"))
        .header("x-fault", Fault::InternalErrorBeforeApply.name())
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let res = tower_svc.oneshot(req).await.unwrap();
    assert_eq!(res.status(), 200); // spent the one retry

    let res = send(
        &ours(policy),
        Method::GET,
        &server.url("reqwest-get"),
        Fault::InternalErrorBeforeApply,
    )
    .await
    .unwrap();
    assert_eq!(res.status(), 500);
    let report = res.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.stop_reason(), StopReason::Budget);
}

#[test]
fn reqwest_errors_are_classified_by_kind() {
    // A request the caller built wrong: final. (reqwest-middleware reports builder errors
    // before any middleware runs; the classification is public for SDKs with their own loop.)
    let builder_err = reqwest::Client::new().get("not a url").build().unwrap_err();
    assert!(builder_err.is_builder());
    assert_eq!(
        tower_retry_safety::classify::classify_error(&builder_err),
        FailureClass::Final
    );
}

#[tokio::test]
async fn reqwest_timeout_after_connecting_is_ambiguous_and_refused_is_not_sent() {
    let server = FaultServer::start().await;
    let client = reqwest_client();
    let err = client
        .post(server.url("slow"))
        .header("x-fault", Fault::SlowAfterApply.name())
        .send()
        .await
        .unwrap_err();
    assert!(err.is_timeout() && !err.is_connect());
    assert_eq!(
        tower_retry_safety::classify::classify_error(&err),
        FailureClass::Ambiguous
    );

    let refused = refused_addr().await;
    let err = client
        .get(format!("http://{refused}/x"))
        .send()
        .await
        .unwrap_err();
    assert!(err.is_connect());
    assert_eq!(
        tower_retry_safety::classify::classify_error(&err),
        FailureClass::NotSent
    );
}
