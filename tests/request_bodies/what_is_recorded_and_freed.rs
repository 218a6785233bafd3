//! What the replay buffer records and keeps, from an adversarial review: no header value in
//! its `Debug`, the recording freed when the request future returns (both fixed), and a request
//! that will never be retried, or one under an outer layer, not recorded again.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use crate::replay_edge_bodies::{body, policy, Boxed};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use tower::{Layer, Service, ServiceExt};
use tower_retry_safety::service::{Recorded, ReplayBuffer};
use tower_retry_safety::{ReplayBody, RetryPolicy};

/// A body type that records itself, and keeps what `record` was given.
struct Probe(Boxed, Arc<Mutex<Option<String>>>);

impl Body for Probe {
    type Data = Bytes;
    type Error = io::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        std::pin::Pin::new(&mut self.0).poll_frame(cx)
    }
}

impl ReplayBody for Probe {
    fn try_clone_body(&self) -> Option<Self> {
        None
    }
    fn record(self, buffer: &ReplayBuffer) -> Recorded<Self> {
        *self.1.lock().unwrap() = Some(format!("{buffer:?}"));
        Recorded::once(self)
    }
}

/// Found in review (low), fixed: `ReplayBuffer`'s derived `Debug` prints the request's content-length header
/// value (`declared_len: Some(..)`), against the rule that no header value appears in any
/// Debug output.
#[tokio::test(start_paused = true)]
async fn replay_buffer_debug_shows_no_header_value() {
    let seen = Arc::new(Mutex::new(None));
    let (inner_body, _) = body(1, 7, None);
    let req = Request::put("http://api.test/v1/files/1")
        .header("content-length", "7")
        .body(Probe(inner_body, seen.clone()))
        .unwrap();
    let inner = tower::service_fn(|req: Request<Probe>| async move {
        let _ = req.into_body().collect().await;
        Ok::<_, io::Error>(Response::new(Full::<Bytes>::default()))
    });
    let _ = policy(1024)
        .build()
        .unwrap()
        .layer(inner)
        .oneshot(req)
        .await;
    let debug = seen.lock().unwrap().clone().expect("record was called");
    assert!(!debug.contains('7'), "{debug}");
}

/// Owns a chunk's bytes and says when they are freed.
struct Flagged(Arc<std::sync::atomic::AtomicBool>, Vec<u8>);

impl AsRef<[u8]> for Flagged {
    fn as_ref(&self) -> &[u8] {
        &self.1
    }
}

impl Drop for Flagged {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Found in review (low), fixed: the recording outlives the response. `ResponseFuture` keeps its `Replay`
/// (the recording, the caller's body, a clone of the inner service) after it has returned
/// its output, until the future value is dropped: a request future that has ended but is
/// still stored (a select loop, a struct field) pins up to `replay_buffer` bytes.
#[tokio::test]
async fn the_recording_is_freed_when_the_request_future_returns() {
    let freed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let chunk = Bytes::from_owner(Flagged(freed.clone(), vec![7; 100]));
    let frames = vec![Ok::<_, io::Error>(Frame::data(chunk))];
    let body: Boxed = UnsyncBoxBody::new(StreamBody::new(futures_util::stream::iter(frames)));
    let inner = tower::service_fn(|req: Request<Boxed>| async move {
        let mut body = req.into_body();
        while let Some(frame) = body.frame().await {
            drop(frame);
        }
        Ok::<_, io::Error>(Response::new(Full::<Bytes>::default()))
    });
    let req = Request::put("http://api.test/v1/files/1")
        .body(body)
        .unwrap();
    let mut svc = policy(1024).build().unwrap().layer(inner);
    let mut fut = Box::pin(svc.ready().await.unwrap().call(req));
    let res = (&mut fut).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    // (freed once the response is out, freed once the future value is dropped)
    let after_response = freed.load(Ordering::SeqCst);
    drop(fut);
    let after_drop = freed.load(Ordering::SeqCst);
    assert_eq!((after_response, after_drop), (true, true));
}

/// Checks (pass): a request that will never be retried (max_retries(0), `NoRetry`) is not
/// recorded, and an inner layer under an outer one does not record the outer layer's replay
/// again.
#[tokio::test(start_paused = true)]
async fn check_what_is_recorded() {
    use tower_retry_safety::service::Replayable;
    use tower_retry_safety::NoRetry;
    type R = Replayable<Boxed>;
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = seen.clone();
    let inner = tower::service_fn(move |req: Request<R>| {
        let log = log.clone();
        async move {
            log.lock().unwrap().push(format!("{:?}", req.body()));
            let _ = req.into_body().collect().await;
            Ok::<_, io::Error>(Response::new(Full::<Bytes>::default()))
        }
    });
    let put = |ext: bool| {
        let (b, _) = body(2, 5, None);
        let mut req = Request::put("http://api.test/v1/files/1")
            .body(Replayable::new(b))
            .unwrap();
        if ext {
            req.extensions_mut().insert(NoRetry);
        }
        req
    };
    let none = RetryPolicy::builder().max_retries(0).build().unwrap();
    none.layer(inner.clone()).oneshot(put(false)).await.unwrap();
    let on = policy(1024).build().unwrap();
    on.layer(inner.clone()).oneshot(put(true)).await.unwrap();
    on.layer(inner.clone()).oneshot(put(false)).await.unwrap();
    let stacked = on.layer(policy(1024).build().unwrap().layer(inner.clone()));
    stacked.oneshot(put(false)).await.unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            "Replayable { recorded: false, .. }",
            "Replayable { recorded: false, .. }",
            "Replayable { recorded: true, .. }",
            "Replayable { recorded: true, .. }",
        ]
    );
}
