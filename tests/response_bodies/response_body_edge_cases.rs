//! The response body classifier's edge cases (`PeekBodyLayer`, `PeekedBody`,
//! `PeekBodyMiddleware`), from an adversarial review: a verdict used up by the layer that
//! decides (an outer layer never repeats a write on it), a chunked stream with a
//! content-length header not waited on, frames read bounded, the stricter of stacked verdicts;
//! and behaviour checked and found correct.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_retry_safety::{FailureClass, PeekBodyLayer, RetryPolicy, RetryReport, StopReason};

fn policy() -> RetryPolicy {
    RetryPolicy::builder()
        .jitter(false)
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .no_budget()
        .build()
        .unwrap()
}

fn rate_limited(_: StatusCode, _: &HeaderMap, body: &[u8]) -> Option<FailureClass> {
    (body == b"rate_limited").then_some(FailureClass::NotSent)
}

fn post(uri: &str) -> Request<Full<Bytes>> {
    Request::post(uri)
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap()
}

fn get(uri: &str) -> Request<Full<Bytes>> {
    Request::get(uri).body(Full::new(Bytes::new())).unwrap()
}

/// A loopback server that answers every request with `raw` (written as is), then keeps the
/// connection open for `hold` (or closes it). Counts the requests it received.
async fn raw_server(raw: &'static [u8], hold: Duration) -> (SocketAddr, Arc<AtomicUsize>) {
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

// ---------------------------------------------------------------------------------------------
// 1. A verdict outlives the retry layer that consumed it.
// ---------------------------------------------------------------------------------------------

/// A handler that applies a write, then calls an upstream through its own retry stack
/// (`RetrySafety` over `PeekBodyLayer`) and returns the upstream's response as is. The
/// upstream always says `rate_limited` (proof that *the upstream* applied nothing). The
/// handler itself is called through an outer `RetrySafety`, for a POST: the outer layer must
/// not take the inner classifier's `NotSent` as proof that the *handler* applied nothing.
#[tokio::test]
async fn a_verdict_consumed_by_an_inner_retry_layer_does_not_make_an_outer_layer_repeat_a_write() {
    let upstream = tower::service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(
            Response::builder()
                .header("content-length", "12")
                .body(Full::new(Bytes::from_static(b"rate_limited")))
                .unwrap(),
        )
    });
    let inner_stack = ServiceBuilder::new()
        .layer(
            RetryPolicy::builder()
                .max_retries(1)
                .backoff(Duration::from_millis(1), Duration::from_millis(1))
                .no_budget()
                .build()
                .unwrap(),
        )
        .layer(PeekBodyLayer::new(64, rate_limited))
        .service(upstream);

    let applied = Arc::new(AtomicUsize::new(0));
    let handler = {
        let applied = applied.clone();
        tower::service_fn(move |_req: Request<Full<Bytes>>| {
            let applied = applied.clone();
            let inner_stack = inner_stack.clone();
            async move {
                // The handler's own write.
                applied.fetch_add(1, Ordering::SeqCst);
                // Then the upstream call; its final response is returned as is.
                inner_stack
                    .oneshot(post("http://upstream.test/charge"))
                    .await
            }
        })
    };
    let outer = policy().layer(handler);
    let res = outer.oneshot(post("http://app.test/order")).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        applied.load(Ordering::SeqCst),
        1,
        "the outer layer repeated a write on a verdict that an inner layer had already used"
    );
}

// ---------------------------------------------------------------------------------------------
// 2. By default "a stream is never waited on": a chunked stream that also carries a
//    Content-Length header is waited on.
// ---------------------------------------------------------------------------------------------

/// RFC 9112 §6.3: Transfer-Encoding overrides Content-Length; hyper decodes the body as
/// chunked (an endless stream here) but leaves the Content-Length header in place. The
/// default `wants` trusts the header, so the response is held until the limit is read.
#[tokio::test]
async fn by_default_a_chunked_stream_that_also_declares_a_content_length_is_not_waited_on() {
    let raw: &'static [u8] =
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n3\r\nabc\r\n";
    let (addr, _) = raw_server(raw, Duration::from_secs(30)).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let uri = format!("http://{addr}/events");

    // Control: without the classifier the head arrives at once.
    let plain = ServiceBuilder::new()
        .layer(policy())
        .service(client.clone());
    let res = tokio::time::timeout(Duration::from_secs(2), plain.oneshot(get(&uri)))
        .await
        .expect("the head arrives without the classifier")
        .unwrap();
    assert_eq!(res.status(), 200);
    drop(res);

    let svc = ServiceBuilder::new()
        .layer(policy())
        .layer(PeekBodyLayer::new(4096, rate_limited))
        .service(client);
    let res = tokio::time::timeout(Duration::from_secs(2), svc.oneshot(get(&uri))).await;
    assert!(
        res.is_ok(),
        "the default classifier waited on a chunked stream (it trusted the content-length header)"
    );
}

// ---------------------------------------------------------------------------------------------
// 3, 4. Empty data frames: nothing bounds how many are kept, and the reading never yields.
// ---------------------------------------------------------------------------------------------

/// Yields `empties` empty data frames, each ready at once, then `tail`, then ends. Counts the
/// frames polled.
struct EmptyFrames {
    empties: usize,
    tail: Option<Bytes>,
    polled: Arc<AtomicUsize>,
}

impl Body for EmptyFrames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.polled.fetch_add(1, Ordering::Relaxed);
        if self.empties > 0 {
            self.empties -= 1;
            return Poll::Ready(Some(Ok(Frame::data(Bytes::new()))));
        }
        Poll::Ready(self.tail.take().map(|t| Ok(Frame::data(t))))
    }
}

fn empty_frames_service(
    empties: usize,
    polled: Arc<AtomicUsize>,
) -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<EmptyFrames>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    tower::service_fn(move |_req: Request<Full<Bytes>>| {
        let polled = polled.clone();
        async move {
            Ok::<_, Infallible>(Response::new(EmptyFrames {
                empties,
                tail: Some(Bytes::from_static(b"abc")),
                polled,
            }))
        }
    })
}

/// The limit is 16 bytes; a body of a million empty frames is kept whole (a million
/// `Bytes` in the `VecDeque`, ~32 MB) before the response is handed on.
#[tokio::test]
async fn the_number_of_frames_kept_is_bounded() {
    let polled = Arc::new(AtomicUsize::new(0));
    let svc = PeekBodyLayer::new(16, rate_limited)
        .when(|_, _| true)
        .layer(empty_frames_service(1_000_000, polled.clone()));
    let res = svc.oneshot(get("http://api.test/")).await.unwrap();
    let kept = polled.load(Ordering::Relaxed);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"abc", "the content reaches the caller");
    assert!(
        kept <= 16 * 64,
        "{kept} frames were read and kept before the response was handed on (limit: 16 bytes)"
    );
}

/// The reading loop never returns `Pending` while frames are ready, so the retry layer's
/// attempt timer is never polled: a 20 ms attempt timeout does not cut a read that takes
/// far longer.
/// Fixed by capping the frames read (1,024): the reading ends at once and the response is
/// handed on, unclassified, the rest still streaming.
#[tokio::test]
async fn a_read_of_endless_ready_empty_frames_ends_and_hands_the_response_on() {
    let polled = Arc::new(AtomicUsize::new(0));
    let policy = RetryPolicy::builder()
        .attempt_timeout(Duration::from_millis(20))
        .no_budget()
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(policy)
        .layer(PeekBodyLayer::new(16, rate_limited).when(|_, _| true))
        .service(empty_frames_service(2_000_000, polled.clone()));
    let res = svc.oneshot(post("http://api.test/")).await.unwrap();
    assert_eq!(
        polled.load(Ordering::Relaxed),
        1024,
        "frames read before the response"
    );
    let report = RetryReport::of(&res).unwrap();
    assert_eq!(
        (report.attempts(), report.stop_reason()),
        (1, StopReason::Final)
    );
}

// ---------------------------------------------------------------------------------------------
// Checked and found correct.
// ---------------------------------------------------------------------------------------------

/// Yields the frames given, in order, then ends.
struct Scripted {
    frames: std::collections::VecDeque<Result<Frame<Bytes>, std::io::Error>>,
}

impl Body for Scripted {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        Poll::Ready(self.frames.pop_front())
    }
}

fn trailers() -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert("grpc-status", HeaderValue::from_static("0"));
    t
}

async fn frames_of<B>(mut body: B) -> Vec<String>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        out.push(match frame {
            Ok(f) if f.is_data() => format!("data:{:?}", f.into_data().unwrap()),
            Ok(f) => format!("trailers:{:?}", f.into_trailers().unwrap()),
            Err(e) => format!("error:{e}"),
        });
    }
    out
}

fn scripted(frames: Vec<Result<Frame<Bytes>, std::io::Error>>) -> Scripted {
    Scripted {
        frames: frames.into(),
    }
}

#[tokio::test]
async fn frames_trailers_and_errors_reach_the_caller_in_place() {
    let classified = Arc::new(AtomicUsize::new(0));
    let seen = classified.clone();
    let layer = PeekBodyLayer::new(8, move |_, _, _: &[u8]| {
        seen.fetch_add(1, Ordering::SeqCst);
        None
    })
    .when(|_, _| true);
    type Frames = Vec<Result<Frame<Bytes>, std::io::Error>>;
    // The body's frames, what the caller must read, and how many times it is classified.
    let cases: Vec<(Frames, Vec<&str>, usize)> = vec![
        // Within the limit, with trailers: classified, sent as it came.
        (
            vec![
                Ok(Frame::data(Bytes::from_static(b"ab"))),
                Ok(Frame::data(Bytes::new())),
                Ok(Frame::data(Bytes::from_static(b"cd"))),
                Ok(Frame::trailers(trailers())),
            ],
            // The empty chunk is not kept: it sends nothing.
            vec![
                "data:b\"ab\"",
                "data:b\"cd\"",
                "trailers:{\"grpc-status\": \"0\"}",
            ],
            1,
        ),
        // An error within the limit: not classified, delivered after what was read.
        (
            vec![
                Ok(Frame::data(Bytes::from_static(b"ab"))),
                Err(std::io::Error::other("reset")),
            ],
            vec!["data:b\"ab\"", "error:reset"],
            0,
        ),
        // Over the limit: not classified; the rest, its trailers and its error follow.
        (
            vec![
                Ok(Frame::data(Bytes::from_static(b"01234"))),
                Ok(Frame::data(Bytes::from_static(b"56789"))),
                Ok(Frame::data(Bytes::from_static(b"x"))),
                Ok(Frame::trailers(trailers())),
            ],
            vec![
                "data:b\"01234\"",
                "data:b\"56789\"",
                "data:b\"x\"",
                "trailers:{\"grpc-status\": \"0\"}",
            ],
            0,
        ),
        // Empty.
        (vec![], vec![], 1),
    ];
    for (frames, want, classified_now) in cases {
        let before = classified.load(Ordering::SeqCst);
        let body = std::sync::Mutex::new(Some(scripted(frames)));
        let svc = layer.layer(tower::service_fn(move |_: Request<()>| {
            let body = body.lock().unwrap().take().unwrap();
            async move { Ok::<_, Infallible>(Response::new(body)) }
        }));
        let res = svc.oneshot(Request::new(())).await.unwrap();
        assert_eq!(frames_of(res.into_body()).await, want);
        assert_eq!(classified.load(Ordering::SeqCst) - before, classified_now);
    }
}

#[tokio::test]
async fn size_hint_and_end_of_stream_follow_the_frames() {
    let svc = PeekBodyLayer::new(8, |_, _, _: &[u8]| None)
        .when(|_, _| true)
        .layer(tower::service_fn(|_: Request<()>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"abc"))))
        }));
    let mut body = svc.oneshot(Request::new(())).await.unwrap().into_body();
    assert_eq!(body.size_hint().exact(), Some(3));
    assert!(!body.is_end_stream());
    let _ = body.frame().await.unwrap().unwrap();
    assert_eq!(body.size_hint().exact(), Some(0));
    assert!(body.is_end_stream());
    assert!(body.frame().await.is_none());

    // Not read (no content-length): the original's hints, as they are.
    let svc = PeekBodyLayer::new(8, |_, _, _: &[u8]| None).layer(tower::service_fn(
        |_: Request<()>| async {
            let s = futures_util::stream::iter(vec![Ok::<_, Infallible>(Frame::data(
                Bytes::from_static(b"abc"),
            ))]);
            Ok::<_, Infallible>(Response::new(StreamBody::new(s)))
        },
    ));
    let body = svc.oneshot(Request::new(())).await.unwrap().into_body();
    let hint: SizeHint = body.size_hint();
    assert_eq!((hint.lower(), hint.upper()), (0, None));
    assert!(!body.is_end_stream());
    // Debug shows no content.
    assert!(!format!("{body:?}").contains("abc"));
}

#[tokio::test]
async fn content_length_values_a_server_controls_never_panic_and_the_length_read_is_the_bodys() {
    let values: Vec<Vec<&'static [u8]>> = vec![
        vec![b"-1"],
        vec![b"1e3"],
        vec![b"99999999999999999999999999"],
        vec![b"18446744073709551615"],
        vec![b" 3"],
        vec![b"3, 3"],
        vec![b"\xff\xfe"],
        vec![b"5000", b"3"],
    ];
    for vals in values {
        let read = Arc::new(AtomicUsize::new(0));
        let seen = read.clone();
        let vals2 = vals.clone();
        let svc = PeekBodyLayer::new(4096, move |_, _, _: &[u8]| {
            seen.fetch_add(1, Ordering::SeqCst);
            None
        })
        .layer(tower::service_fn(move |_: Request<()>| {
            let vals = vals2.clone();
            async move {
                let mut res = Response::new(Full::new(Bytes::from_static(b"abc")));
                for v in vals {
                    res.headers_mut()
                        .append("content-length", HeaderValue::from_bytes(v).unwrap());
                }
                Ok::<_, Infallible>(res)
            }
        }));
        let res = svc.oneshot(Request::new(())).await.unwrap();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"abc");
        // The header is not what decides: the body's own length (3, within the limit) is.
        assert_eq!(read.load(Ordering::SeqCst), 1, "{vals:?}");
    }
}

/// A read cut by the attempt timeout is ambiguous: the write is never sent again; a read is.
#[tokio::test]
async fn a_body_read_cut_by_the_attempt_timeout_is_ambiguous() {
    let raw: &'static [u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\nrate_";
    let policy = || {
        RetryPolicy::builder()
            .attempt_timeout(Duration::from_millis(150))
            .backoff(Duration::from_millis(1), Duration::from_millis(1))
            .max_retries(1)
            .no_budget()
            .build()
            .unwrap()
    };
    let (addr, count) = raw_server(raw, Duration::from_secs(30)).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let svc = ServiceBuilder::new()
        .layer(policy())
        .layer(PeekBodyLayer::new(4096, rate_limited))
        .service(client.clone());
    let err = svc
        .clone()
        .oneshot(post(&format!("http://{addr}/charge")))
        .await
        .unwrap_err();
    assert!(err.is_ambiguous() && err.is_timeout(), "{err}");
    assert_eq!(err.attempts(), 1);
    assert_eq!(err.stop_reason(), StopReason::SuppressedNotIdempotent);
    assert_eq!(count.load(Ordering::SeqCst), 1);

    let (addr, count) = raw_server(raw, Duration::from_secs(30)).await;
    let err = svc
        .oneshot(get(&format!("http://{addr}/items")))
        .await
        .unwrap_err();
    assert_eq!(err.attempts(), 2);
    assert_eq!(count.load(Ordering::SeqCst), 2);
}

/// A body that ends early (the connection closes): the error reaches the caller after the
/// bytes read, the response is classified by its status (a 200: final), the write is not
/// repeated.
#[tokio::test]
async fn a_truncated_body_delivers_its_error_and_is_not_classified() {
    let raw: &'static [u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\nrate_";
    let (addr, count) = raw_server(raw, Duration::ZERO).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let svc = ServiceBuilder::new()
        .layer(policy())
        .layer(PeekBodyLayer::new(4096, |_, _, _: &[u8]| {
            Some(FailureClass::NotSent)
        }))
        .service(client);
    let res = svc
        .oneshot(post(&format!("http://{addr}/charge")))
        .await
        .unwrap();
    assert_eq!(RetryReport::of(&res).unwrap().attempts(), 1);
    let frames = frames_of(res.into_body()).await;
    assert_eq!(frames[0], "data:b\"rate_\"");
    assert!(frames[1].starts_with("error:"), "{frames:?}");
    assert_eq!(frames.len(), 2);
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

/// The classifier panics: the panic reaches the caller's task (nothing catches it).
#[tokio::test]
async fn a_panicking_classifier_panics_the_callers_task() {
    let svc = ServiceBuilder::new()
        .layer(policy())
        .layer(PeekBodyLayer::new(64, |_, _, _: &[u8]| {
            panic!("classifier bug")
        }))
        .service(tower::service_fn(|_: Request<Full<Bytes>>| async {
            Ok::<_, Infallible>(
                Response::builder()
                    .header("content-length", "3")
                    .body(Full::new(Bytes::from_static(b"abc")))
                    .unwrap(),
            )
        }));
    let join = tokio::spawn(svc.oneshot(post("http://api.test/")));
    assert!(join.await.unwrap_err().is_panic());
}

/// h2: data and trailers come through, the response is classified.
#[tokio::test]
async fn h2_responses_with_trailers() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req: Request<Incoming>| {
                    let n = seen.fetch_add(1, Ordering::SeqCst);
                    async move {
                        let text: &'static [u8] = if n == 0 { b"rate_limited" } else { b"ok" };
                        let frames = vec![
                            Ok::<_, Infallible>(Frame::data(Bytes::from_static(text))),
                            Ok(Frame::trailers(trailers())),
                        ];
                        let body = StreamBody::new(futures_util::stream::iter(frames));
                        Ok::<_, Infallible>(
                            Response::builder()
                                .header("content-length", text.len().to_string())
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
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let svc = ServiceBuilder::new()
        .layer(policy())
        .layer(PeekBodyLayer::new(4096, rate_limited))
        .service(client);
    let res = svc
        .oneshot(post(&format!("http://{addr}/charge")))
        .await
        .unwrap();
    assert_eq!(res.version(), http::Version::HTTP_2);
    assert_eq!(RetryReport::of(&res).unwrap().attempts(), 2);
    assert_eq!(
        frames_of(res.into_body()).await,
        vec!["data:b\"ok\"", "trailers:{\"grpc-status\": \"0\"}"]
    );
    assert_eq!(count.load(Ordering::SeqCst), 2);
}

#[cfg(feature = "reqwest-middleware")]
mod reqwest_adapter {
    use super::*;
    use reqwest_middleware::{ClientBuilder, Middleware, Next};
    use tower_retry_safety::{PeekBodyMiddleware, RetrySafetyMiddleware};

    #[derive(Clone, Debug, PartialEq)]
    struct Marker(u32);

    /// Innermost: marks each response with an extension of its own.
    struct Mark;
    #[async_trait::async_trait]
    impl Middleware for Mark {
        async fn handle(
            &self,
            req: reqwest::Request,
            ext: &mut http::Extensions,
            next: Next<'_>,
        ) -> reqwest_middleware::Result<reqwest::Response> {
            let mut res = next.run(req, ext).await?;
            res.extensions_mut().insert(Marker(7));
            Ok(res)
        }
    }

    #[tokio::test]
    async fn the_reqwest_middleware_keeps_the_whole_response() {
        let raw: &'static [u8] =
            b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\nx-a: 1\r\nx-a: 2\r\n\r\nok";
        let (addr, _) = raw_server(raw, Duration::ZERO).await;
        let url = format!("http://{addr}/a?secret=1");
        let plain = reqwest::Client::new();
        let want = plain.get(&url).send().await.unwrap();
        let client = ClientBuilder::new(reqwest::Client::new())
            .with(RetrySafetyMiddleware::new(policy()))
            .with(PeekBodyMiddleware::new(4096, |_, _, _: &[u8]| None).when(|_, _| true))
            .with(Mark)
            .build();
        let res = client.get(&url).send().await.unwrap();
        assert_eq!(res.status(), want.status());
        assert_eq!(res.version(), want.version());
        assert_eq!(res.headers(), want.headers());
        assert_eq!(res.url(), want.url());
        assert_eq!(res.remote_addr(), want.remote_addr());
        assert!(res.remote_addr().is_some());
        assert_eq!(res.content_length(), want.content_length());
        assert_eq!(res.extensions().get::<Marker>(), Some(&Marker(7)));
        assert_eq!(res.bytes().await.unwrap(), want.bytes().await.unwrap());
    }

    /// A body cut short: the caller still gets the error (a body error).
    #[tokio::test]
    async fn the_reqwest_middleware_delivers_a_body_error() {
        let raw: &'static [u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\nrate_";
        let (addr, count) = raw_server(raw, Duration::ZERO).await;
        let client = ClientBuilder::new(reqwest::Client::new())
            .with(RetrySafetyMiddleware::new(policy()))
            .with(PeekBodyMiddleware::new(4096, |_, _, _: &[u8]| {
                Some(FailureClass::NotSent)
            }))
            .build();
        let res = client
            .post(format!("http://{addr}/charge"))
            .body("{}")
            .send()
            .await
            .unwrap();
        let err = res.bytes().await.unwrap_err();
        assert!(err.is_body() || err.is_decode(), "{err:?}");
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    /// As the tower test: the default classifier waits on a chunked stream that also carries
    /// a Content-Length header.
    #[tokio::test]
    async fn the_reqwest_middleware_waits_on_a_chunked_stream_with_a_content_length() {
        let raw: &'static [u8] = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n3\r\nabc\r\n";
        let (addr, _) = raw_server(raw, Duration::from_secs(30)).await;
        // Control: without the classifier the head arrives at once.
        let plain = reqwest::Client::new()
            .get(format!("http://{addr}/events"))
            .send();
        let head = tokio::time::timeout(Duration::from_secs(2), plain).await;
        assert_eq!(head.expect("control").unwrap().status(), 200);
        let client = ClientBuilder::new(reqwest::Client::new())
            .with(RetrySafetyMiddleware::new(policy()))
            .with(PeekBodyMiddleware::new(4096, rate_limited))
            .build();
        let sent = client.get(format!("http://{addr}/events")).send();
        let res = tokio::time::timeout(Duration::from_secs(2), sent).await;
        assert!(
            res.is_ok(),
            "the head of a stream was held back by the default classifier"
        );
    }

    /// Added before `RetrySafetyMiddleware`, the classifier runs once, after the retries: its
    /// verdict cannot make a write retryable. (Misordering is silent.)
    #[tokio::test]
    async fn misordered_middleware_never_retries_a_write() {
        let raw: &'static [u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\nrate_limited";
        let (addr, count) = raw_server(raw, Duration::ZERO).await;
        let client = ClientBuilder::new(reqwest::Client::new())
            .with(PeekBodyMiddleware::new(4096, rate_limited))
            .with(RetrySafetyMiddleware::new(policy()))
            .build();
        let res = client
            .post(format!("http://{addr}/charge"))
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(res.bytes().await.unwrap(), "rate_limited");
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }
}

/// SUSPECTED (design): two stacked classifiers inside one retry layer disagree: the inner one says `Final`, the
/// outer one `NotSent`. The stricter verdict should hold (as for route spellings): a write
/// that one classifier calls final is not repeated.
#[tokio::test]
async fn stacked_classifiers_the_stricter_verdict_holds() {
    let applied = Arc::new(AtomicUsize::new(0));
    let seen = applied.clone();
    let svc = ServiceBuilder::new()
        .layer(policy())
        .layer(PeekBodyLayer::new(64, |_, _, _: &[u8]| {
            Some(FailureClass::NotSent)
        }))
        .layer(PeekBodyLayer::new(64, |_, _, _: &[u8]| {
            Some(FailureClass::Final)
        }))
        .service(tower::service_fn(move |_: Request<Full<Bytes>>| {
            seen.fetch_add(1, Ordering::SeqCst);
            async {
                Ok::<_, Infallible>(
                    Response::builder()
                        .header("content-length", "2")
                        .body(Full::new(Bytes::from_static(b"ok")))
                        .unwrap(),
                )
            }
        }));
    let res = svc.oneshot(post("http://api.test/")).await.unwrap();
    assert_eq!(RetryReport::of(&res).unwrap().attempts(), 1);
    assert_eq!(applied.load(Ordering::SeqCst), 1);
}
