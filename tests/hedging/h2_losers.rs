//! The attempt that loses to a hedge over HTTP/2: dropping it resets its stream, so the
//! server's handler is cancelled, and the connection stays up for the hedge and later requests.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{Layer, ServiceExt};
use tower_retry_safety::{Hedge, RetryPolicy, RetryReport};

#[derive(Default)]
struct Counts {
    connections: AtomicU32,
    requests: AtomicU32,
    cancelled: AtomicU32,
}

/// Counts its handler's cancellation: dropped before it answered.
struct Cancelled(Arc<Counts>, bool);

impl Drop for Cancelled {
    fn drop(&mut self) {
        if !self.1 {
            self.0.cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// An HTTP/2 server whose answer to a GET's first attempt (`x-attempt: 1`) takes 10 s (counted
/// if cancelled), the others none. Chosen by the attempt's number, not by arrival: under load the
/// hedge, sent 20 ms later on a connection still being set up, can arrive first (seen once in a
/// full test run: the first attempt then "won").
async fn server(counts: Arc<Counts>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counts.connections.fetch_add(1, Ordering::SeqCst);
            let counts = counts.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let counts = counts.clone();
                    let first = req.method() == http::Method::GET
                        && req.headers().get("x-attempt").is_some_and(|v| v == "1");
                    async move {
                        counts.requests.fetch_add(1, Ordering::SeqCst);
                        if first {
                            // Only the slow handler's cancellation is counted.
                            let mut guard = Cancelled(counts.clone(), false);
                            tokio::time::sleep(Duration::from_secs(10)).await;
                            guard.1 = true;
                        }
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    format!("http://{addr}/items")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loser_is_reset_and_the_connection_kept() {
    let counts = Arc::new(Counts::default());
    let url = server(counts.clone()).await;
    let policy = RetryPolicy::builder()
        .hedge(Hedge::fixed(Duration::from_millis(20)).max_extra_load(1.0))
        .attempt_header(Some(http::HeaderName::from_static("x-attempt")))
        .build()
        .unwrap();
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let svc = policy.layer(client);
    let get = Request::get(&url).body(Full::new(Bytes::new())).unwrap();
    let res = svc.clone().oneshot(get).await.unwrap();
    let report = RetryReport::of(&res).cloned().unwrap();
    res.into_body().collect().await.unwrap();
    assert_eq!(
        (report.hedges(), report.won_by(), report.superseded()),
        (1, Some(2), 1)
    );
    // The reset reaches the server: its slow handler (10 s) is dropped. Waited for, with a
    // bound so that a missing reset fails rather than hangs.
    let reset = async {
        while counts.cancelled.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), reset)
        .await
        .expect("the loser's stream was reset");
    // A POST (never hedged) on the same connection.
    let post = Request::post(&url).body(Full::new(Bytes::new())).unwrap();
    let res = svc.oneshot(post).await.unwrap();
    assert_eq!(RetryReport::of(&res).map(RetryReport::attempts), Some(1));
    res.into_body().collect().await.unwrap();
    assert_eq!(counts.cancelled.load(Ordering::SeqCst), 1);
    assert_eq!(counts.requests.load(Ordering::SeqCst), 3);
    assert_eq!(
        counts.connections.load(Ordering::SeqCst),
        1,
        "one connection throughout"
    );
}
