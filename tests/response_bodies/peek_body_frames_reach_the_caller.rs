//! The classified body (`PeekedBody`), checked and found correct by an adversarial review:
//! frames, trailers and errors reach the caller in place, size hints and end of stream follow the
//! frames, content-length values a server controls never panic, a truncated body delivers its
//! error, a panicking classifier panics the caller's task, and h2 responses keep their trailers.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::peek_body_support::{policy, post, rate_limited, raw_server};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_retry_safety::peek::PeekBodyLayer;
use tower_retry_safety::{FailureClass, RetryReport};

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
