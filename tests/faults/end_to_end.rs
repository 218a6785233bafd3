//! End to end: hyper-util's client under `ServiceBuilder` with this layer and a per-attempt
//! timeout, against a real hyper server on loopback that injects one fault into each
//! operation's first attempt. Side effects are counted on the server.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use retry_safety_testing::fault_server::{refused_addr, Fault, FaultServer};
use tokio::sync::Notify;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_retry_safety::{
    FailureClass, Idempotency, NoRetry, RetryPolicy, RetryReport, StopReason,
};

// Well under the fault server's 800 ms slow response, well over a loaded machine's round trip.
const PER_ATTEMPT: Duration = Duration::from_millis(400);

fn policy() -> tower_retry_safety::RetryPolicyBuilder {
    RetryPolicy::builder()
        .max_retries(3)
        .backoff(Duration::from_millis(5), Duration::from_millis(50))
        .route(Method::POST, "/ops/{op}/search", Idempotency::Idempotent)
        .no_budget()
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

fn request(method: Method, url: &str, fault: Fault) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(url)
        .header("x-fault", fault.name())
        .body(Full::new(Bytes::from_static(b"{\"to\":\"a@example.com\"}")))
        .unwrap()
}

async fn send<S>(
    svc: &mut S,
    req: Request<Full<Bytes>>,
) -> Result<Response<Bytes>, tower_retry_safety::Error>
where
    S: Service<
        Request<Full<Bytes>>,
        Response = Response<hyper::body::Incoming>,
        Error = tower_retry_safety::Error,
    >,
{
    let res = svc.ready().await?.call(req).await?;
    let (parts, body) = res.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    Ok(Response::from_parts(parts, body))
}

#[tokio::test]
async fn no_write_applied_twice_and_every_read_recovered() {
    let server = FaultServer::start().await;
    let mut svc = ServiceBuilder::new()
        .layer(policy().build().unwrap())
        .timeout(PER_ATTEMPT)
        .service(client());

    let mut post_ok = 0;
    let mut post_suppressed = 0;
    for fault in Fault::ALL {
        let op = format!("post-{}", fault.name());
        let out = send(&mut svc, request(Method::POST, &server.url(&op), fault)).await;
        let stats = server.stats(&op);
        // The one claim that matters: never twice.
        assert_eq!(stats.applied, u32::from(fault.applies()), "{op}: {stats:?}");
        assert_eq!(
            stats.attempts, 1,
            "{op}: a write is sent once unless provably not sent"
        );
        match fault {
            Fault::None => {
                assert_eq!(out.unwrap().status(), StatusCode::OK);
                post_ok += 1;
            }
            Fault::DropAfterApply | Fault::SlowAfterApply => {
                let err = out.unwrap_err();
                assert!(err.is_ambiguous(), "{op}");
                assert!(err.retry_suppressed(), "{op}");
                assert_eq!(err.attempts(), 1);
                assert_eq!(err.failure_class(), Some(FailureClass::Ambiguous));
                assert_eq!(
                    err.is_timeout(),
                    fault == Fault::SlowAfterApply,
                    "{op}: {err}"
                );
                post_suppressed += 1;
            }
            Fault::UnavailableAfterApply
            | Fault::TooManyRequestsBeforeApply
            | Fault::InternalErrorBeforeApply => {
                // Retries end on a response: it is returned with its report, not an error.
                let res = out.unwrap();
                let report = res.extensions().get::<RetryReport>().unwrap();
                assert!(report.retry_suppressed(), "{op}");
                assert_eq!(report.attempts(), 1);
                assert!(res.status().is_client_error() || res.status().is_server_error());
                post_suppressed += 1;
            }
        }
    }
    assert_eq!((post_ok, post_suppressed), (1, 5));

    for fault in Fault::ALL {
        let op = format!("get-{}", fault.name());
        let res = send(&mut svc, request(Method::GET, &server.url(&op), fault))
            .await
            .unwrap_or_else(|e| panic!("{op}: {e}"));
        assert_eq!(res.status(), StatusCode::OK, "{op}");
        assert_eq!(res.body().as_ref(), format!("GET {op}").as_bytes());
        let report = res.extensions().get::<RetryReport>().unwrap();
        let expected_attempts = if fault == Fault::None { 1 } else { 2 };
        assert_eq!(report.attempts(), expected_attempts, "{op}");
        assert_eq!(server.stats(&op).attempts, expected_attempts, "{op}");
        assert_eq!(report.stop_reason(), StopReason::Final);
    }
    assert_eq!(server.applied_twice(), 0);
}

#[tokio::test]
async fn a_post_routed_as_idempotent_is_retried() {
    let server = FaultServer::start().await;
    let mut svc = ServiceBuilder::new()
        .layer(policy().build().unwrap())
        .timeout(PER_ATTEMPT)
        .service(client());
    let op = "q1/search";
    let res = send(
        &mut svc,
        request(Method::POST, &server.url(op), Fault::DropAfterApply),
    )
    .await
    .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    // A search "applies" nothing real, but the server counts each execution: two.
    assert_eq!(server.stats(op).attempts, 2);
    assert_eq!(server.applied(op), 2);
    let report = res.extensions().get::<RetryReport>().unwrap();
    assert_eq!(
        report.verdict().source(),
        tower_retry_safety::classify::VerdictSource::Route
    );
    let classes: Vec<_> = report.attempt_outcomes().map(|r| r.class()).collect();
    assert_eq!(classes, [FailureClass::Ambiguous, FailureClass::Final]);
}

#[tokio::test]
async fn no_retry_makes_one_attempt() {
    let server = FaultServer::start().await;
    let mut svc = ServiceBuilder::new()
        .layer(policy().build().unwrap())
        .timeout(PER_ATTEMPT)
        .service(client());
    let op = "get-no-retry";
    let mut req = request(
        Method::GET,
        &server.url(op),
        Fault::InternalErrorBeforeApply,
    );
    req.extensions_mut().insert(NoRetry);
    let res = send(&mut svc, req).await.unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(server.stats(op).attempts, 1);
    let report = res.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.stop_reason(), StopReason::NoRetryMarker);
}

/// Between the retry layer and the client: holds the second attempt until the test has
/// started the server, so "refused, then listening" is deterministic.
#[derive(Clone)]
struct GateSecondAttempt<S> {
    inner: S,
    calls: Arc<AtomicU32>,
    first_failed: Arc<Notify>,
    listening: Arc<Notify>,
}

impl<S> Service<Request<Full<Bytes>>> for GateSecondAttempt<S>
where
    S: Service<Request<Full<Bytes>>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    S::Response: Send,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<Full<Bytes>>) -> Self::Future {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let (first_failed, listening) = (self.first_failed.clone(), self.listening.clone());
        Box::pin(async move {
            if n == 2 {
                listening.notified().await;
            }
            let out = inner.call(req).await.map_err(Into::into);
            if n == 1 {
                first_failed.notify_one();
            }
            out
        })
    }
}

#[tokio::test]
async fn a_post_refused_on_its_first_attempt_is_retried_and_applied_once() {
    let addr = refused_addr().await;
    let gate = GateSecondAttempt {
        inner: client(),
        calls: Arc::default(),
        first_failed: Arc::default(),
        listening: Arc::default(),
    };
    let (first_failed, listening, calls) = (
        gate.first_failed.clone(),
        gate.listening.clone(),
        gate.calls.clone(),
    );
    let mut svc = ServiceBuilder::new()
        .layer(policy().build().unwrap())
        .timeout(PER_ATTEMPT)
        .service(gate);
    let url = format!("http://{addr}/ops/refused-post");
    let call = tokio::spawn(async move {
        svc.ready()
            .await
            .unwrap()
            .call(request(Method::POST, &url, Fault::None))
            .await
    });
    first_failed.notified().await;
    let server = FaultServer::start_at(addr).await;
    listening.notify_one();
    let res = call.await.unwrap().unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(server.applied("refused-post"), 1);
    let report = res.extensions().get::<RetryReport>().unwrap();
    let classes: Vec<_> = report.attempt_outcomes().map(|r| r.class()).collect();
    assert_eq!(classes, [FailureClass::NotSent, FailureClass::Final]);
    assert_eq!(report.verdict().idempotency(), Idempotency::NonIdempotent);
}

#[tokio::test]
async fn refused_every_time_is_a_not_sent_error() {
    let addr = refused_addr().await;
    let mut svc = ServiceBuilder::new()
        .layer(policy().max_retries(2).build().unwrap())
        .timeout(PER_ATTEMPT)
        .service(client());
    let url = format!("http://{addr}/ops/x?secret=hunter2");
    let err = send(&mut svc, request(Method::POST, &url, Fault::None))
        .await
        .unwrap_err();
    assert!(err.is_not_sent());
    assert!(!err.is_ambiguous());
    assert_eq!(err.attempts(), 3);
    assert_eq!(err.stop_reason(), StopReason::RetriesExhausted);
    assert_eq!(
        err.to_string(),
        "POST /ops/x failed after 3 attempts (no retries were left): the last attempt never \
         reached the server. It was never applied, so it is safe to send again."
    );
    // source() leads down to hyper-util's connect error.
    let mut source = std::error::Error::source(&err);
    let mut found = false;
    while let Some(e) = source {
        if let Some(e) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
            found = e.is_connect();
        }
        source = e.source();
    }
    assert!(found);
}

#[tokio::test]
async fn a_relative_uri_is_final_not_retried() {
    let mut svc = ServiceBuilder::new()
        .layer(policy().build().unwrap())
        .service(client());
    let err = send(&mut svc, request(Method::GET, "/ops/relative", Fault::None))
        .await
        .unwrap_err();
    assert_eq!(err.failure_class(), Some(FailureClass::Final));
    assert_eq!(err.attempts(), 1);
    assert_eq!(err.stop_reason(), StopReason::Final);
}

#[tokio::test]
async fn a_request_the_client_cannot_send_is_not_ambiguous() {
    let mut svc = ServiceBuilder::new()
        .layer(policy().build().unwrap())
        .service(client());
    let err = send(
        &mut svc,
        request(Method::POST, "/ops/relative", Fault::None),
    )
    .await
    .unwrap_err();
    assert!(err.is_not_sent());
    assert_eq!(
        err.to_string(),
        "POST /ops/relative failed after 1 attempt (the error is final): the last attempt failed \
         with an error that retrying cannot fix. It was never sent; fix the request before \
         sending it again."
    );
}
