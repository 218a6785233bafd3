//! HTTP/2 stream errors through hyper-util's client: a remote `REFUSED_STREAM` is not sent
//! (RFC 9113 §8.7), any other remote reset is ambiguous.
#![cfg(feature = "h2")]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use h2::Reason;
use http::{Method, Request, Response};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tower::{Layer, ServiceExt};
use tower_retry_safety::{classify_error, FailureClass, RetryPolicy, StopReason};

type Seen = Arc<Mutex<HashMap<String, u32>>>;

/// An h2 server: `/refuse` resets with REFUSED_STREAM, `/internal` with INTERNAL_ERROR,
/// anything else answers 200. Counts the streams it received per path.
async fn h2_server() -> (String, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let seen: Seen = Arc::default();
    let counts = seen.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let counts = counts.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(socket).await else {
                    return;
                };
                while let Some(Ok((req, mut respond))) = conn.accept().await {
                    let path = req.uri().path().to_owned();
                    *counts.lock().unwrap().entry(path.clone()).or_default() += 1;
                    match path.as_str() {
                        "/refuse" => respond.send_reset(Reason::REFUSED_STREAM),
                        "/internal" => respond.send_reset(Reason::INTERNAL_ERROR),
                        _ => {
                            let _ = respond.send_response(Response::new(()), true);
                        }
                    }
                }
            });
        }
    });
    (base, seen)
}

fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

fn policy() -> RetryPolicy {
    RetryPolicy::builder()
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .no_budget()
        .build()
        .unwrap()
}

fn req(method: Method, url: String) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(url)
        .body(Full::new(Bytes::from_static(b"x")))
        .unwrap()
}

#[tokio::test]
async fn refused_stream_is_not_sent_and_a_post_is_retried() {
    let (base, seen) = h2_server().await;
    // The raw error first: what hyper-util hands back for a REFUSED_STREAM.
    let raw = client()
        .request(req(Method::POST, format!("{base}/refuse")))
        .await
        .unwrap_err();
    assert_eq!(classify_error(&raw), FailureClass::NotSent, "{raw:?}");

    let err = policy()
        .layer(client())
        .oneshot(req(Method::POST, format!("{base}/refuse")))
        .await
        .unwrap_err();
    assert!(err.is_not_sent(), "{err:?}");
    assert_eq!(err.attempts(), 3);
    assert_eq!(err.stop_reason(), StopReason::RetriesExhausted);
    assert_eq!(seen.lock().unwrap()["/refuse"], 4);
}

#[tokio::test]
async fn other_remote_resets_are_ambiguous_and_suppress_a_post() {
    let (base, seen) = h2_server().await;
    let err = policy()
        .layer(client())
        .oneshot(req(Method::POST, format!("{base}/internal")))
        .await
        .unwrap_err();
    assert!(err.is_ambiguous(), "{err:?}");
    assert!(err.retry_suppressed());
    assert_eq!(err.attempts(), 1);
    assert_eq!(seen.lock().unwrap()["/internal"], 1);
}
