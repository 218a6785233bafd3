//! An empty streamed body that the transport never polls (a proxied `GET`'s `Incoming`,
//! boxed) is retried after a `503` behind the layer (through the proxy example: the end-to-end
//! tests' request_bodies/replay_proxy.rs); found by an adversarial review, fixed.

use std::convert::Infallible;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::replay_edge_bodies::{policy, Boxed};
use crate::replay_reader::report;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use tower::{Layer, Service, ServiceExt};

/// An inner service that sends a body as hyper does: not polled at all when it says it is at
/// its end (`is_end_stream`), read to its end otherwise. It answers 503, then 200.
#[derive(Clone, Default)]
struct LikeHyper {
    calls: Arc<AtomicUsize>,
}

impl<B> Service<Request<B>> for LikeHyper
where
    B: Body + Send + Unpin + 'static,
{
    type Response = Response<Full<Bytes>>;
    type Error = io::Error;
    type Future = BoxFuture<'static, Result<Self::Response, io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let mut body = req.into_body();
        Box::pin(async move {
            if !body.is_end_stream() {
                while let Some(frame) = body.frame().await {
                    if frame.is_err() {
                        return Err(io::Error::other("body"));
                    }
                }
            }
            let mut res = Response::new(Full::default());
            if n == 0 {
                *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            }
            Ok(res)
        })
    }
}

/// Found in review, fixed: an empty streaming body (a proxied GET or DELETE: hyper's `Incoming` for a request
/// without a body, boxed) is recorded, but the transport never polls a body that is at its
/// end, so the recording never learns it ended: a 503 is refused with "the response arrived
/// before its body was sent to the end", and the idempotent request is not retried.
#[tokio::test(start_paused = true)]
async fn an_empty_streamed_body_that_the_transport_never_polls_is_retried_after_503() {
    let policy = policy(64 * 1024).build().unwrap();
    let inner = LikeHyper::default();
    let body: Boxed = UnsyncBoxBody::new(Empty::<Bytes>::new().map_err(|e: Infallible| match e {}));
    let req = Request::get("http://api.test/v1/files/1")
        .body(body)
        .unwrap();
    let out = policy.layer(inner.clone()).oneshot(req).await;
    let report = report(&out);
    assert_eq!(report.body_not_replayable(), None);
    assert_eq!(report.attempts(), 2);
    assert_eq!(out.unwrap().status(), StatusCode::OK);
}
