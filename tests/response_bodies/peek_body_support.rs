//! What the response body classifier's edge cases (`PeekBodyLayer`, `PeekBodyMiddleware`)
//! share: the policy, a classifier that calls `rate_limited` not sent, requests, and a loopback
//! server that answers every request with raw bytes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tower_retry_safety::{FailureClass, RetryPolicy};

pub(crate) fn policy() -> RetryPolicy {
    RetryPolicy::builder()
        .jitter(false)
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .no_budget()
        .build()
        .unwrap()
}

pub(crate) fn rate_limited(_: StatusCode, _: &HeaderMap, body: &[u8]) -> Option<FailureClass> {
    (body == b"rate_limited").then_some(FailureClass::NotSent)
}

pub(crate) fn post(uri: &str) -> Request<Full<Bytes>> {
    Request::post(uri)
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap()
}

pub(crate) fn get(uri: &str) -> Request<Full<Bytes>> {
    Request::get(uri).body(Full::new(Bytes::new())).unwrap()
}

/// A loopback server that answers every request with `raw` (written as is), then keeps the
/// connection open for `hold` (or closes it). Counts the requests it received.
pub(crate) async fn raw_server(
    raw: &'static [u8],
    hold: Duration,
) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                // The request's head and its small body.
                loop {
                    let n = stream.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                        let len = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if buf.len() >= end + 4 + len {
                            break;
                        }
                    }
                }
                seen.fetch_add(1, Ordering::SeqCst);
                let _ = stream.write_all(raw).await;
                let _ = stream.flush().await;
                tokio::time::sleep(hold).await;
            });
        }
    });
    (addr, count)
}
