//! How far the response body classifier reads (`PeekBodyLayer`), from an adversarial review:
//! a chunked stream that also declares a content-length is not waited on, the frames read are
//! bounded (a read of endless ready empty frames ends and hands the response on), and a read cut
//! by the attempt timeout is ambiguous (a write is never sent again).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::peek_body_support::{get, policy, post, rate_limited, raw_server};
use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_retry_safety::peek::PeekBodyLayer;
use tower_retry_safety::{RetryPolicy, RetryReport, StopReason};

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
