//! Over HTTP/2, against hyper's server with a body that fails after some bytes (hyper then
//! resets the stream): a write whose body is cut is sent once, a `GET` within the limit is read
//! again, and one past the limit is resumed with `Range`.
//!
//! Found by the adversarial review of reading whole bodies (issue 23).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use super::{policy, req};
use crate::read_whole_reqwest::{BIG, HALF};
use bytes::Bytes;
use http::{Method, Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use retry_safety_testing::raw_server::{rep, RawCounts};
use retry_safety_testing::read_whole::read_all;
use tokio::net::TcpListener;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_retry_safety::resume::{ReadWholeLayer, WholeBody};
use tower_retry_safety::RetryPolicy;

fn h2_stack(
    policy: RetryPolicy,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<WholeBody<Incoming>>,
    Error = tower_retry_safety::Error,
> + Clone {
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    ServiceBuilder::new()
        .layer(policy)
        .layer(ReadWholeLayer::new())
        .service(client)
}

/// A body that yields `at` bytes (with an exact length of `len`), then fails: hyper's HTTP/2
/// server then resets the stream.
struct FailAfter {
    data: Option<Bytes>,
    len: u64,
    /// A pause before the failure, so that the head and the data reach the client before
    /// the reset (h2 drops a stream's buffered head when its reset comes first).
    pause: Pin<Box<tokio::time::Sleep>>,
}

impl Body for FailAfter {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if let Some(d) = self.data.take().filter(|d| !d.is_empty()) {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        std::task::ready!(self.pause.as_mut().poll(_cx));
        Poll::Ready(Some(Err(std::io::Error::other("cut"))))
    }
    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.len)
    }
}

async fn h2_server(
    len: usize,
    at: usize,
    cut_first_only: bool,
) -> (
    std::net::SocketAddr,
    Arc<RawCounts>,
    tokio::task::JoinHandle<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counts = Arc::new(RawCounts::default());
    let c = counts.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let counts = c.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let counts = counts.clone();
                    async move {
                        let n = counts.requests.fetch_add(1, Ordering::SeqCst) + 1;
                        if req.method() != Method::GET {
                            counts.writes.fetch_add(1, Ordering::SeqCst);
                        }
                        let data = Bytes::from(rep(len, 1));
                        let upto = if n == 1 || !cut_first_only { at } else { len };
                        let body = FailAfter {
                            data: Some(data.slice(..upto)),
                            len: len as u64,
                            pause: Box::pin(tokio::time::sleep(Duration::from_millis(50))),
                        };
                        let body: http_body_util::combinators::UnsyncBoxBody<
                            Bytes,
                            std::io::Error,
                        > = if upto == len {
                            Full::new(data).map_err(|e| match e {}).boxed_unsync()
                        } else {
                            body.boxed_unsync()
                        };
                        Ok::<_, std::io::Error>(
                            Response::builder()
                                .header("content-length", len)
                                .body(body)
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, counts, task)
}

/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn h2_writes_whose_body_is_cut_are_sent_once_and_reads_are_read_again() {
    for (len, at) in [(1000, 0), (1000, 500), (BIG, HALF)] {
        let (addr, counts, task) = h2_server(len, at, true).await;
        let url = format!("http://{addr}/v1/send");
        // Cut before any data, hyper's server resets the stream before the head: the
        // request then fails as a whole (ambiguous, not retried).
        match h2_stack(policy().build().unwrap())
            .oneshot(req(Method::POST, &url, None))
            .await
        {
            Ok(res) => {
                let (bytes, err) = read_all(res.into_body()).await;
                assert!(err.is_some());
                assert_eq!(bytes.len(), at);
            }
            Err(err) => assert!(err.is_ambiguous() && at == 0, "{err:?}"),
        }
        assert_eq!(
            counts.writes.load(Ordering::SeqCst),
            1,
            "h2 POST {len} {at}"
        );
        assert_eq!(counts.requests.load(Ordering::SeqCst), 1);
        task.abort();
    }
    // A GET within the limit is read again over h2.
    let (addr, counts, task) = h2_server(1000, 500, true).await;
    let res = h2_stack(policy().build().unwrap())
        .oneshot(req(Method::GET, &format!("http://{addr}/f"), None))
        .await
        .unwrap();
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(bytes, rep(1000, 1));
    assert_eq!(counts.requests.load(Ordering::SeqCst), 2);
    task.abort();
}

/// An HTTP/2 server with ranges and `etag: "v1"`; the first response is cut after `HALF`.
async fn h2_range_server() -> (
    std::net::SocketAddr,
    Arc<RawCounts>,
    tokio::task::JoinHandle<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counts = Arc::new(RawCounts::default());
    let c = counts.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let counts = c.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let counts = counts.clone();
                    async move {
                        let n = counts.requests.fetch_add(1, Ordering::SeqCst) + 1;
                        let whole = Bytes::from(rep(BIG, 1));
                        let from = req
                            .headers()
                            .get("range")
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| {
                                v.strip_prefix("bytes=")?.strip_suffix('-')?.parse().ok()
                            });
                        let res = Response::builder().header("etag", "\"v1\"");
                        let (res, data) = match from {
                            Some(from) => {
                                counts.ranges.fetch_add(1, Ordering::SeqCst);
                                let from: usize = from;
                                (
                                    res.status(206).header(
                                        "content-range",
                                        format!("bytes {from}-{}/{BIG}", BIG - 1),
                                    ),
                                    whole.slice(from..),
                                )
                            }
                            None => (res, whole),
                        };
                        let len = data.len();
                        let body: http_body_util::combinators::UnsyncBoxBody<
                            Bytes,
                            std::io::Error,
                        > = if n == 1 {
                            FailAfter {
                                data: Some(data.slice(..HALF)),
                                len: len as u64,
                                pause: Box::pin(tokio::time::sleep(Duration::from_millis(50))),
                            }
                            .boxed_unsync()
                        } else {
                            Full::new(data).map_err(|e| match e {}).boxed_unsync()
                        };
                        Ok::<_, std::io::Error>(
                            res.header("content-length", len).body(body).unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, counts, task)
}

/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn h2_a_get_past_the_limit_is_resumed_with_range() {
    let (addr, counts, task) = h2_range_server().await;
    let res = h2_stack(policy().build().unwrap())
        .oneshot(req(Method::GET, &format!("http://{addr}/f"), None))
        .await
        .unwrap();
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(bytes, rep(BIG, 1));
    assert_eq!(counts.requests.load(Ordering::SeqCst), 2);
    assert_eq!(counts.ranges.load(Ordering::SeqCst), 1);
    task.abort();
}
