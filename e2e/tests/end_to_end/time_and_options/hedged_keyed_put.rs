//! A hedged keyed PUT against the server's `IdempotencyLayer` over real sockets: the hedge
//! meets the original in flight, and the handler runs once. From the review of 2026-12-04;
//! the client-side cases of that review are the client's
//! tests/time_and_options/keyed_requests_resent_or_not.rs.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tower::{Layer, ServiceExt};
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};
use tower_retry_safety::{Hedge, RetryPolicy};

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A keyed PUT (source Method now, so hedged like an unkeyed PUT) against a real
/// IdempotencyLayer server whose handler takes 600 ms: the hedge meets the original in flight
/// (409, retried with backoff, never final while the original runs). The handler runs exactly
/// once and the caller gets the original's 200.
///
/// Found by the review of 2026-12-04.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedged_keyed_put_against_the_server_layer_runs_once() {
    let runs = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(AtomicUsize::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let layer = IdempotencyLayer::new(MemoryStore::new()).lease(Duration::from_secs(5));
    let counter = runs.clone();
    let svc = layer.layer(tower::service_fn(move |_req: Request<_>| {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(600)).await;
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"put"))))
        }
    }));
    let requests = seen.clone();
    let server = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (svc, requests) = (svc.clone(), requests.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    requests.fetch_add(1, Ordering::SeqCst);
                    tower::ServiceExt::oneshot(svc.clone(), req)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    let policy = RetryPolicy::builder()
        .jitter(false)
        .no_budget()
        .max_retries(5)
        .backoff(Duration::from_millis(100), Duration::from_millis(100))
        .honor_idempotency_key(true)
        .hedge(Hedge::fixed(Duration::from_millis(50)).max_extra_load(1.0))
        .build()
        .unwrap();
    let stack = policy.layer(client());
    let req = Request::put(format!("http://{addr}/v1/things/1"))
        .header("idempotency-key", "\"put-1204\"")
        .body(Full::new(Bytes::from_static(b"{\"v\":1}")))
        .unwrap();
    let res = stack.oneshot(req).await.unwrap();
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        (status, &body[..]),
        (StatusCode::OK, &b"put"[..]),
        "sent {}",
        seen.load(Ordering::SeqCst)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(seen.load(Ordering::SeqCst) >= 2, "the PUT was hedged");
    server.abort();
}
