//! HTTP/2 stream errors through hyper-util's client: a remote `REFUSED_STREAM` is not sent
//! (RFC 9113 §8.7), any other remote reset is ambiguous, and so is a remote GOAWAY (hyper
//! cannot say whether it wrote the request; see tests/faults/goaway_storm.rs for the storm).
#![cfg(feature = "h2")]

use std::collections::HashMap;
use std::error::Error as StdError;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use h2::Reason;
use http::{Method, Request, Response};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower::{Layer, ServiceExt};
use tower_retry_safety::classify::classify_error;
use tower_retry_safety::{FailureClass, RetryPolicy, StopReason};

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

/// Frames of the hand-written server below: a 9-byte header (length, type, flags, stream 0)
/// and, for GOAWAY, last-stream-id 0 and NO_ERROR.
const SETTINGS: [u8; 9] = [0, 0, 0, 4, 0, 0, 0, 0, 0];
const SETTINGS_ACK: [u8; 9] = [0, 0, 0, 4, 1, 0, 0, 0, 0];
const GOAWAY_0: [u8; 17] = [0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

/// One connection of an HTTP/2 server that answers every request's HEADERS with a GOAWAY whose
/// last-stream-id is 0, then reads until the client hangs up (closing first could reset the
/// connection before the client reads the GOAWAY). Counts the HEADERS it saw.
async fn goaway_conn(mut socket: TcpStream, seen: Arc<AtomicUsize>) -> std::io::Result<()> {
    let mut preface = [0; 24];
    socket.read_exact(&mut preface).await?;
    socket.write_all(&SETTINGS).await?;
    let mut head = [0; 9];
    loop {
        socket.read_exact(&mut head).await?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        socket.read_exact(&mut vec![0; len]).await?;
        match (head[3], head[4] & 1) {
            (4, 0) => socket.write_all(&SETTINGS_ACK).await?,
            (1, _) => {
                seen.fetch_add(1, Ordering::SeqCst);
                socket.write_all(&GOAWAY_0).await?;
            }
            _ => {}
        }
    }
}

async fn goaway_server() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(goaway_conn(socket, counter.clone()));
        }
    });
    (base, seen)
}

#[tokio::test]
async fn a_remote_goaway_is_ambiguous_so_a_post_is_not_retried_and_a_get_is() {
    let (base, seen) = goaway_server().await;
    // The raw error: the request's stream is above last-stream-id 0, so h2 fails it with the
    // GOAWAY, the same error hyper gives a request it may have written.
    let raw = client()
        .request(req(Method::POST, format!("{base}/write")))
        .await
        .unwrap_err();
    let goaway = std::iter::successors(Some(&raw as &(dyn StdError + 'static)), |&e| e.source())
        .filter_map(|e| e.downcast_ref::<h2::Error>())
        .any(|e| e.is_remote() && e.is_go_away());
    assert!(goaway, "{raw:?}");
    assert_eq!(classify_error(&raw), FailureClass::Ambiguous, "{raw:?}");
    assert_eq!(seen.load(Ordering::SeqCst), 1);

    let err = policy()
        .layer(client())
        .oneshot(req(Method::POST, format!("{base}/write")))
        .await
        .unwrap_err();
    assert!(err.is_ambiguous() && err.retry_suppressed(), "{err:?}");
    assert_eq!(err.attempts(), 1);
    assert_eq!(seen.load(Ordering::SeqCst), 2);

    let err = policy()
        .layer(client())
        .oneshot(req(Method::GET, format!("{base}/read")))
        .await
        .unwrap_err();
    assert!(err.is_ambiguous(), "{err:?}");
    assert_eq!(err.attempts(), 3);
    assert_eq!(err.stop_reason(), StopReason::RetriesExhausted);
    assert_eq!(seen.load(Ordering::SeqCst), 5);
}
