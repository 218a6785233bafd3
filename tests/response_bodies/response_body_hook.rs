//! Responses classified by their bodies (`PeekBodyLayer`, `PeekBodyMiddleware`) against a
//! server on loopback that counts what it applies: a 200 whose JSON says "rate limited"
//! before anything ran is retried for a write, exactly once more; a "still running" body makes
//! a read retryable and never a write; the body reaches the caller intact.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{ServiceBuilder, ServiceExt};
use tower_retry_safety::peek::PeekBodyLayer;
use tower_retry_safety::{FailureClass, RetryPolicy, RetryReport, StopReason};

#[derive(Default)]
struct Counts {
    attempts: HashMap<String, u32>,
    applied: HashMap<String, u32>,
}

type Shared = Arc<Mutex<Counts>>;

/// `/limited`: the first attempt is answered 200 `{"error":"rate_limited"}` and not applied.
/// `/running`: the first attempt is applied and answered 200 `{"status":"still_running"}`.
/// `/long`: applied, answered with 10 KiB of JSON. `/chunked`: like `/limited`, without a
/// content-length.
async fn serve() -> (SocketAddr, Shared) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counts: Shared = Arc::default();
    let state = counts.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let state = state.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(answer(&state, req)) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, counts)
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

fn answer(state: &Shared, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let mut counts = state.lock().unwrap();
    let attempt = {
        let n = counts.attempts.entry(path.clone()).or_default();
        *n += 1;
        *n
    };
    let mut apply = || *counts.applied.entry(path.clone()).or_default() += 1;
    let full = |text: String| Full::new(Bytes::from(text)).boxed();
    match (path.as_str(), attempt) {
        ("/limited", 1) => Response::new(full("{\"error\":\"rate_limited\"}".into())),
        ("/chunked", 1) => {
            let chunks: Vec<Result<_, Infallible>> = vec![Ok(http_body::Frame::data(
                Bytes::from_static(b"{\"error\":\"rate_limited\"}"),
            ))];
            Response::new(StreamBody::new(futures_util::stream::iter(chunks)).boxed())
        }
        ("/running", 1) => {
            apply();
            Response::new(full("{\"status\":\"still_running\"}".into()))
        }
        ("/long", _) => {
            apply();
            let pad = "x".repeat(10 * 1024);
            Response::new(full(format!(
                "{{\"error\":\"rate_limited\",\"pad\":\"{pad}\"}}"
            )))
        }
        _ => {
            apply();
            Response::new(full("{\"ok\":true}".into()))
        }
    }
}

fn classify(_: StatusCode, _: &HeaderMap, body: &[u8]) -> Option<FailureClass> {
    let has = |needle: &[u8]| body.windows(needle.len()).any(|w| w == needle);
    if has(b"\"rate_limited\"") {
        // This API's rate limiter answers before anything runs.
        Some(FailureClass::NotSent)
    } else if has(b"\"still_running\"") {
        Some(FailureClass::RetryableResponse)
    } else {
        None
    }
}

fn policy() -> RetryPolicy {
    RetryPolicy::builder()
        .backoff(Duration::from_millis(5), Duration::from_millis(20))
        .no_budget()
        .build()
        .unwrap()
}

/// Sends one request through the layer, with or without the body classifier; returns the
/// status, the body and the report.
async fn send(
    addr: SocketAddr,
    method: Method,
    path: &str,
    peek: Option<PeekBodyLayer>,
) -> (StatusCode, Bytes, RetryReport) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let (status, report, body) = match peek {
        Some(peek) => {
            let svc = ServiceBuilder::new()
                .layer(policy())
                .layer(peek)
                .service(client);
            let res = svc.oneshot(req).await.unwrap();
            let report = RetryReport::of(&res).unwrap().clone();
            let status = res.status();
            (
                status,
                report,
                res.into_body().collect().await.unwrap().to_bytes(),
            )
        }
        None => {
            let res = ServiceBuilder::new()
                .layer(policy())
                .service(client)
                .oneshot(req)
                .await
                .unwrap();
            let report = RetryReport::of(&res).unwrap().clone();
            let status = res.status();
            (
                status,
                report,
                res.into_body().collect().await.unwrap().to_bytes(),
            )
        }
    };
    (status, body, report)
}

fn counts(counts: &Shared, path: &str) -> (u32, u32) {
    let c = counts.lock().unwrap();
    (
        c.attempts.get(path).copied().unwrap_or(0),
        c.applied.get(path).copied().unwrap_or(0),
    )
}

#[tokio::test]
async fn a_rate_limited_200_is_proof_nothing_ran_and_a_write_is_retried_once_more() {
    let (addr, state) = serve().await;
    let peek = PeekBodyLayer::new(4096, classify);
    let (status, body, report) = send(addr, Method::POST, "/limited", Some(peek)).await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"{\"ok\":true}"[..]));
    assert_eq!(report.attempts(), 2);
    assert_eq!(counts(&state, "/limited"), (2, 1));

    // The control: without the classifier the 200 is final, and the write never happened.
    let (addr, state) = serve().await;
    let (_, body, report) = send(addr, Method::POST, "/limited", None).await;
    assert_eq!(&body[..], b"{\"error\":\"rate_limited\"}");
    assert_eq!(report.attempts(), 1);
    assert_eq!(counts(&state, "/limited"), (1, 0));
}

#[tokio::test]
async fn still_running_retries_a_read_and_never_a_write() {
    let (addr, state) = serve().await;
    let peek = || Some(PeekBodyLayer::new(4096, classify));
    let (_, body, report) = send(addr, Method::GET, "/running", peek()).await;
    assert_eq!(&body[..], b"{\"ok\":true}");
    assert_eq!(report.attempts(), 2);

    let (addr, state_post) = serve().await;
    let (_, body, report) = send(addr, Method::POST, "/running", peek()).await;
    assert_eq!(&body[..], b"{\"status\":\"still_running\"}");
    assert_eq!(report.attempts(), 1);
    assert_eq!(report.stop_reason(), StopReason::SuppressedNotIdempotent);
    assert_eq!(counts(&state_post, "/running"), (1, 1));
    drop(state);
}

#[tokio::test]
async fn a_body_over_the_limit_is_not_classified_and_reaches_the_caller_whole() {
    let (addr, state) = serve().await;
    let peek = PeekBodyLayer::new(1024, classify).when(|_, _| true);
    let (status, body, report) = send(addr, Method::POST, "/long", Some(peek)).await;
    assert_eq!(status, StatusCode::OK);
    let pad = "x".repeat(10 * 1024);
    let whole = format!("{{\"error\":\"rate_limited\",\"pad\":\"{pad}\"}}");
    assert_eq!(body, whole.as_bytes());
    assert_eq!(report.attempts(), 1);
    assert_eq!(counts(&state, "/long"), (1, 1));
}

#[tokio::test]
async fn by_default_a_body_without_a_declared_length_is_not_read() {
    let (addr, _) = serve().await;
    let peek = || PeekBodyLayer::new(4096, classify);
    let (_, _, report) = send(addr, Method::POST, "/chunked", Some(peek())).await;
    assert_eq!(report.attempts(), 1);
    // Chosen with `when`, it is.
    let (addr, state) = serve().await;
    let (_, body, report) = send(
        addr,
        Method::POST,
        "/chunked",
        Some(peek().when(|status, _| status == StatusCode::OK)),
    )
    .await;
    assert_eq!(&body[..], b"{\"ok\":true}");
    assert_eq!(report.attempts(), 2);
    assert_eq!(counts(&state, "/chunked"), (2, 1));
}

#[cfg(feature = "reqwest-middleware")]
#[tokio::test]
async fn the_reqwest_middleware_classifies_alike_and_keeps_the_url() {
    use reqwest_middleware::ClientBuilder;
    use tower_retry_safety::peek::PeekBodyMiddleware;
    use tower_retry_safety::RetrySafetyMiddleware;

    let (addr, state) = serve().await;
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetrySafetyMiddleware::new(policy()))
        .with(PeekBodyMiddleware::new(4096, classify))
        .build();
    let url = format!("http://{addr}/limited");
    let res = client.post(&url).body("{}").send().await.unwrap();
    assert_eq!(res.url().as_str(), url);
    assert_eq!(RetryReport::of_reqwest(&res).unwrap().attempts(), 2);
    assert_eq!(res.bytes().await.unwrap(), "{\"ok\":true}");
    assert_eq!(counts(&state, "/limited"), (2, 1));
}
