//! When a body is not sent again, and the report says why: past the limit (streamed, or known
//! from its size hint), a response before the body ended, a body still held by the last attempt;
//! a request that is never retried is not recorded; a replay buffer over a gibibyte fails to
//! build.

use std::io;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::replay_reader::{policy, put, send, stream, whole, Chunks, End, Reader, Received};
use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use tower::{Layer, Service, ServiceExt};
use tower_retry_safety::service::{NotReplayable, Replayable};
use tower_retry_safety::{NoRetry, RequestOptions, RetryPolicy, RetryReport, StopReason};

/// A body that streams past the limit: the attempt goes on to the end, and the request is not
/// sent again; the report gives the limit.
#[tokio::test(start_paused = true)]
async fn a_body_past_the_limit_is_sent_whole_once_and_reported() {
    let chunks: Chunks = (0..8).map(|_| vec![7u8; 1024]).collect();
    let reader = Reader::new(vec![(99, End::Reset), (99, End::Ok)]);
    let body = stream(&chunks, false).boxed();
    let err = send(policy(4096), &reader, put(body)).await.unwrap_err();
    let got = reader.received();
    assert_eq!(got.len(), 1);
    assert_eq!(
        Received {
            exact_len: None,
            ..got[0].clone()
        },
        whole(&chunks, false)
    );
    let report = err.report().unwrap();
    assert_eq!(report.stop_reason(), StopReason::BodyNotReplayable);
    assert_eq!(
        report.body_not_replayable(),
        Some(NotReplayable::OverLimit { limit: 4096 })
    );
    assert!(
        err.to_string()
            .contains("larger than the 4096-byte replay buffer"),
        "{err}"
    );
}

/// A body whose size hint is already over the limit is not recorded at all.
#[tokio::test(start_paused = true)]
async fn a_body_known_to_be_over_the_limit_is_not_recorded() {
    let body = Full::new(Bytes::from(vec![1u8; 5000]))
        .map_err(|never| match never {})
        .boxed();
    let reader = Reader::new(vec![(0, End::Reset), (99, End::Ok)]);
    let err = send(policy(4096), &reader, put(body)).await.unwrap_err();
    assert_eq!(reader.received().len(), 1);
    assert_eq!(
        err.report().unwrap().body_not_replayable(),
        Some(NotReplayable::OverLimit { limit: 4096 })
    );
}

/// The server answered before the body was sent to its end: not retried (linkerd's rule).
#[tokio::test(start_paused = true)]
async fn a_response_before_the_body_ended_is_not_retried() {
    let chunks: Chunks = vec![b"abc".to_vec(), b"def".to_vec()];
    let reader = Reader::new(vec![(1, End::Unavailable), (99, End::Ok)]);
    let res = send(policy(1024), &reader, put(stream(&chunks, false).boxed()))
        .await
        .unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(reader.received().len(), 1);
    let report = RetryReport::of(&res).unwrap();
    assert_eq!(report.stop_reason(), StopReason::BodyNotReplayable);
    assert_eq!(
        report.body_not_replayable(),
        Some(NotReplayable::ResponseBeforeEnd)
    );
}

/// An inner service that keeps the failed attempt's body: the retry waits for it at most a
/// second, then stops with the reason.
#[tokio::test(start_paused = true)]
async fn a_body_still_held_by_the_last_attempt_stops_the_retry() {
    let chunks: Chunks = vec![b"abc".to_vec()];
    let mut reader = Reader::new(vec![(0, End::Reset), (99, End::Ok)]);
    reader.holds = true;
    let started = tokio::time::Instant::now();
    let err = send(policy(1024), &reader, put(stream(&chunks, false).boxed()))
        .await
        .unwrap_err();
    assert_eq!(reader.received().len(), 1);
    assert_eq!(
        err.report().unwrap().body_not_replayable(),
        Some(NotReplayable::StillInUse)
    );
    // The backoff (10 ms), then the wait for the body (1 s).
    assert_eq!(started.elapsed(), Duration::from_millis(1010));
}

/// A request that can never be retried is not recorded: its body reaches the service as the
/// caller made it.
#[tokio::test(start_paused = true)]
async fn a_request_that_is_never_retried_is_not_recorded() {
    #[derive(Clone)]
    struct Peek(Arc<Mutex<Vec<String>>>);
    impl<B: Body + 'static> Service<Request<Replayable<B>>> for Peek {
        type Response = Response<Full<Bytes>>;
        type Error = io::Error;
        type Future = std::future::Ready<Result<Self::Response, io::Error>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, req: Request<Replayable<B>>) -> Self::Future {
            self.0.lock().unwrap().push(format!("{:?}", req.body()));
            std::future::ready(Ok(Response::new(Full::default())))
        }
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let body = || Replayable::new(stream(&vec![b"x".to_vec()], false));
    let mut no_retry = put(body());
    no_retry.extensions_mut().insert(NoRetry);
    let mut zero = put(body());
    zero.extensions_mut()
        .insert(RequestOptions::new().max_retries(0));
    let off = put(body());
    for (req, policy) in [
        (no_retry, policy(1024)),
        (zero, policy(1024)),
        (off, policy(0)),
        (put(body()), policy(1024)),
    ] {
        policy.layer(Peek(seen.clone())).oneshot(req).await.unwrap();
    }
    let seen = seen.lock().unwrap();
    assert_eq!(
        *seen,
        [
            "Replayable { recorded: false, .. }",
            "Replayable { recorded: false, .. }",
            "Replayable { recorded: false, .. }",
            "Replayable { recorded: true, .. }",
        ]
    );
}

#[test]
fn a_replay_buffer_over_a_gibibyte_fails_to_build() {
    let err = RetryPolicy::builder()
        .replay_buffer(2 << 30)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("replay_buffer"), "{err}");
}
