//! A stored response is final (issue: "a stored response is retried as if it could
//! change"). Through real sockets: a hyper server on 127.0.0.1 with `IdempotencyLayer` over a
//! handler that applies its write and then answers 503 (stored, as Stripe does), and the
//! retry layer (and the reqwest adapter) with minted keys in front of it.
//!
//! Exact counts: the handler runs once; the client sends the first attempt (the handler's own
//! 503) and one retry, which gets the stored response, and nothing after it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};
use tower_retry_safety::{RetryPolicy, RetryPolicyBuilder, RetryReport, StopReason};

struct Server {
    addr: SocketAddr,
    /// Requests that reached the server (before the idempotency layer).
    received: Arc<AtomicU32>,
    /// Runs of the handler (its write applied each time).
    ran: Arc<AtomicU32>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `old_server`: strip `x-should-retry` from every response, as a server that honours keys
/// but sends no hint would (the client must stop on the stored-response header alone).
async fn start(old_server: bool) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (received, ran) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let layer = IdempotencyLayer::new(MemoryStore::new());
    let (r, h) = (received.clone(), ran.clone());
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (r, h, layer) = (r.clone(), h.clone(), layer.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    r.fetch_add(1, Ordering::SeqCst);
                    let h = h.clone();
                    let handler =
                        tower::service_fn(move |_req: Request<Either<Full<Bytes>, Incoming>>| {
                            // Applies the write, then fails.
                            h.fetch_add(1, Ordering::SeqCst);
                            async {
                                let mut res = Response::new(Full::new(Bytes::from("upstream")));
                                *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                                Ok::<_, Infallible>(res)
                            }
                        });
                    let call = layer.layer(handler).oneshot(req);
                    async move {
                        let mut res = call.await?;
                        if old_server {
                            res.headers_mut().remove("x-should-retry");
                        }
                        Ok::<_, Infallible>(res)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Server {
        addr,
        received,
        ran,
        task,
    }
}

fn builder() -> RetryPolicyBuilder {
    RetryPolicy::builder()
        .mint_idempotency_keys(true)
        .max_retries(3)
        .backoff(Duration::from_millis(5), Duration::from_millis(20))
        .jitter(false)
        .no_budget()
}

async fn send(server: &Server, policy: RetryPolicy) -> Response<Incoming> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let svc = ServiceBuilder::new().layer(policy).service(client);
    let req = Request::post(format!("http://{}/v1/messages", server.addr))
        .body(Full::new(Bytes::from_static(b"{\"to\":\"a\"}")))
        .unwrap();
    svc.oneshot(req).await.expect("a response")
}

#[tokio::test]
async fn a_stored_503_is_final_and_says_the_server_ran_the_write() {
    // An old server (no hint): only the stored-response header tells the client.
    let server = start(true).await;
    let res = send(&server, builder().build().unwrap()).await;
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["idempotent-replayed"], "true");
    let report = RetryReport::of(&res).expect("report").clone();
    // The handler's own 503, then one retry that got the stored response, and nothing after it.
    assert_eq!(report.attempts(), 2, "{report:?}");
    assert_eq!(report.stop_reason(), StopReason::StoredResponse);
    assert!(report.is_stored_response());
    assert!(report.may_have_been_applied());
    assert!(!report.retry_suppressed());
    let text = report.to_string();
    assert!(text.contains("had already run the request"), "{text}");
    assert!(text.contains("failed there"), "{text}");
    assert_eq!(server.ran.load(Ordering::SeqCst), 1);
    assert_eq!(server.received.load(Ordering::SeqCst), 2);
}

/// Control: the same client, told to ignore the stored-response header, spends every retry on the
/// same stored response (this is what the client did before the fix); the handler still ran once.
#[tokio::test]
async fn control_without_the_stored_response_header_every_retry_is_spent_on_the_stored_response() {
    let server = start(true).await;
    let policy = builder().stored_response_header(None).build().unwrap();
    let res = send(&server, policy).await;
    let report = RetryReport::of(&res).expect("report").clone();
    assert_eq!(report.attempts(), 4, "{report:?}");
    assert_eq!(report.stop_reason(), StopReason::RetriesExhausted);
    assert_eq!(server.ran.load(Ordering::SeqCst), 1);
    assert_eq!(server.received.load(Ordering::SeqCst), 4);
}

/// The server says `x-should-retry: false` every time it answers with a stored 5xx, so a client
/// that does not know the stored-response header (here: ours told to ignore it) stops too.
#[tokio::test]
async fn the_server_marks_every_stored_5xx_it_answers_again_should_not_retry() {
    let server = start(false).await;
    let policy = builder().stored_response_header(None).build().unwrap();
    let res = send(&server, policy).await;
    assert_eq!(res.headers()["x-should-retry"], "false");
    let report = RetryReport::of(&res).expect("report").clone();
    assert_eq!(report.attempts(), 2, "{report:?}");
    assert_eq!(report.stop_reason(), StopReason::Final);
    assert_eq!(server.ran.load(Ordering::SeqCst), 1);
    assert_eq!(server.received.load(Ordering::SeqCst), 2);

    // Without a retrying client: the first answer is the handler's own (no hint), every
    // repeat of the key gets the stored response, with the hint.
    let server = start(false).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = || {
        Request::post(format!("http://{}/v1/messages", server.addr))
            .header("idempotency-key", "\"k-1\"")
            .body(Full::new(Bytes::from_static(b"x")))
            .unwrap()
    };
    let first = client.request(req()).await.unwrap();
    assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(first.headers().get("x-should-retry").is_none());
    for _ in 0..2 {
        let again = client.request(req()).await.unwrap();
        assert_eq!(again.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert_eq!(again.headers()["x-should-retry"], "false");
    }
    assert_eq!(server.ran.load(Ordering::SeqCst), 1);
}

/// The reqwest adapter decides with the same code: it stops on the stored response too.
#[tokio::test]
async fn the_reqwest_adapter_stops_on_a_stored_response() {
    let server = start(true).await;
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(tower_retry_safety::RetrySafetyMiddleware::new(
            builder().build().unwrap(),
        ))
        .build();
    let res = client
        .post(format!("http://{}/v1/messages", server.addr))
        .body("{\"to\":\"a\"}")
        .send()
        .await
        .expect("a response");
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    let report = RetryReport::of_reqwest(&res).expect("report");
    assert_eq!(report.attempts(), 2, "{report:?}");
    assert_eq!(report.stop_reason(), StopReason::StoredResponse);
    assert_eq!(server.ran.load(Ordering::SeqCst), 1);
    assert_eq!(server.received.load(Ordering::SeqCst), 2);
}

/// A custom stored-response header is read instead of the default one.
#[tokio::test]
async fn the_stored_response_header_is_configurable() {
    let server = start(true).await;
    let policy = builder()
        .stored_response_header(Some(HeaderName::from_static("x-replayed")))
        .build()
        .unwrap();
    let res = send(&server, policy).await;
    // The server's header is `idempotent-replayed`, which this policy does not read.
    assert_eq!(
        RetryReport::of(&res).unwrap().stop_reason(),
        StopReason::RetriesExhausted
    );
}
