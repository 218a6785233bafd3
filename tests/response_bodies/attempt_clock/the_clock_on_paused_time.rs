//! The attempt's clock on paused tokio time, against an in-memory service: a stall forever is
//! cut by the per-frame wait, a trickle just under the timeout is bounded only by its length or the
//! deadline, a head at the very instant the timer fires, a deadline-only policy, and empty frames
//! (under and over the cap) then a stall.
//!
//! Found by the adversarial review, round 2, of reading whole bodies (issue 23).

use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use super::req;
use crate::read_whole_reqwest::all_said;
use bytes::Bytes;
use http::{Method, Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use retry_safety_testing::raw_server::rep;
use retry_safety_testing::read_whole::{policy, read_all};
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_retry_safety::resume::ReadWholeLayer;

/// A body of an exact length fed by a channel: it stalls while the sender is alive and sends
/// nothing.
struct Chan {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    left: u64,
}

impl Body for Chan {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match ready!(self.rx.poll_recv(cx)) {
            Some(data) => {
                self.left = self.left.saturating_sub(data.len() as u64);
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            None => Poll::Ready(None),
        }
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}

/// How one call of the in-memory service answers: the head after `head_after`, then each of
/// `frames` after its pause; `stall`: then nothing for good.
#[derive(Clone)]
struct Answer {
    head_after: Duration,
    len: u64,
    frames: Vec<(Duration, Bytes)>,
    stall: bool,
}

type Calls = Arc<AtomicU32>;

/// An in-memory inner service: call n gets `answers[n]` (the last one again after).
fn memory(
    answers: Vec<Answer>,
) -> (
    impl Service<
            Request<Full<Bytes>>,
            Response = Response<Chan>,
            Error = BoxError,
            Future = impl Send + 'static,
        > + Clone
        + Send
        + 'static,
    Calls,
) {
    let calls: Calls = Arc::default();
    let answers = Arc::new(answers);
    let c = calls.clone();
    let svc = tower::service_fn(move |_req: Request<Full<Bytes>>| {
        let n = c.fetch_add(1, Ordering::SeqCst) as usize;
        let answer = answers[n.min(answers.len() - 1)].clone();
        async move {
            tokio::time::sleep(answer.head_after).await;
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            tokio::spawn(async move {
                for (pause, data) in answer.frames {
                    tokio::time::sleep(pause).await;
                    if tx.send(data).await.is_err() {
                        return;
                    }
                }
                if answer.stall {
                    std::future::pending::<()>().await;
                }
                drop(tx);
            });
            Ok::<_, BoxError>(Response::new(Chan {
                rx,
                left: answer.len,
            }))
        }
    });
    (svc, calls)
}

fn bytes_of(len: usize, v: u8) -> Bytes {
    Bytes::from(rep(len, v))
}

/// With no deadline, a body that stalls for good after 10 of its 100 bytes is cut by the
/// per-frame wait (the retry layer's own timer no longer cuts a body being read): read again,
/// 2 calls, whole; the first cut came one per-attempt timeout after the last frame.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test(start_paused = true)]
async fn paused_a_stall_forever_without_a_deadline_is_cut_by_the_per_frame_wait() {
    let t = Duration::from_secs(1);
    let body = bytes_of(100, 1);
    let (svc, calls) = memory(vec![
        Answer {
            head_after: Duration::ZERO,
            len: 100,
            frames: vec![(Duration::ZERO, body.slice(..10))],
            stall: true,
        },
        Answer {
            head_after: Duration::ZERO,
            len: 100,
            frames: vec![(Duration::ZERO, body.clone())],
            stall: false,
        },
    ]);
    let stack = ServiceBuilder::new()
        .layer(policy().attempt_timeout(t).build().unwrap())
        .layer(ReadWholeLayer::new())
        .service(svc);
    let started = tokio::time::Instant::now();
    let res = tokio::time::timeout(
        Duration::from_secs(3600),
        stack.oneshot(req(Method::GET, "http://h/f", &[])),
    )
    .await
    .expect("no hang")
    .expect("answered");
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(bytes, body);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let took = started.elapsed();
    assert!(took >= t && took < 2 * t, "{took:?}");
}

/// With no deadline, a body that trickles one byte every 0.9 × the per-attempt timeout is never
/// cut: 2000 bytes take 1800 per-attempt timeouts (30 min of paused time for `t` = 1 s), in one
/// call. Nothing but the length bounds it (at most limit × `t`: about 18 h for the default
/// 64 KiB and 1 s). With a deadline, the deadline ends it.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test(start_paused = true)]
async fn paused_a_trickle_just_under_the_timeout_is_bounded_only_by_its_length_or_the_deadline() {
    let t = Duration::from_secs(1);
    let gap = t * 9 / 10;
    let len = 2000;
    let body = bytes_of(len, 2);
    let trickle = Answer {
        head_after: Duration::ZERO,
        len: len as u64,
        frames: (0..len).map(|i| (gap, body.slice(i..i + 1))).collect(),
        stall: false,
    };
    let (svc, calls) = memory(vec![trickle.clone()]);
    let started = tokio::time::Instant::now();
    let res = ServiceBuilder::new()
        .layer(policy().attempt_timeout(t).build().unwrap())
        .layer(ReadWholeLayer::new())
        .service(svc)
        .oneshot(req(Method::GET, "http://h/f", &[]))
        .await
        .expect("answered");
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(bytes, body);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(started.elapsed() >= gap * len as u32);

    // A deadline of 100 s ends it: an error naming the deadline, one call.
    let (svc, calls) = memory(vec![trickle]);
    let out = ServiceBuilder::new()
        .layer(
            policy()
                .attempt_timeout(t)
                .deadline(Duration::from_secs(100))
                .build()
                .unwrap(),
        )
        .layer(ReadWholeLayer::new())
        .service(svc)
        .oneshot(req(Method::GET, "http://h/f", &[]))
        .await;
    let err = out.expect_err("the deadline passed while the body was read");
    assert!(all_said(&err).contains("deadline"), "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A head that arrives at the very instant the per-attempt timer fires is read (the attempt is
/// polled before its timer); one a millisecond later is cut and sent again. Whole either way.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test(start_paused = true)]
async fn paused_a_head_at_the_instant_the_timer_fires() {
    let t = Duration::from_secs(1);
    for (late, expected_calls) in [(Duration::ZERO, 1), (Duration::from_millis(1), 2)] {
        let body = bytes_of(100, 3);
        let (svc, calls) = memory(vec![
            Answer {
                head_after: t + late,
                len: 100,
                frames: vec![(Duration::ZERO, body.clone())],
                stall: false,
            },
            Answer {
                head_after: Duration::ZERO,
                len: 100,
                frames: vec![(Duration::ZERO, body.clone())],
                stall: false,
            },
        ]);
        let res = ServiceBuilder::new()
            .layer(policy().attempt_timeout(t).build().unwrap())
            .layer(ReadWholeLayer::new())
            .service(svc)
            .oneshot(req(Method::GET, "http://h/f", &[]))
            .await
            .expect("answered");
        let (bytes, err) = read_all(res.into_body()).await;
        assert!(err.is_none(), "{late:?}: {err:?}");
        assert_eq!(bytes, body, "{late:?}");
        assert_eq!(calls.load(Ordering::SeqCst), expected_calls, "{late:?}");
    }
}

/// A deadline-only policy puts no clock in the attempt: a body that stalls is ended by the
/// deadline (an error naming it), one call; a slow body within the deadline is read whole.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test(start_paused = true)]
async fn paused_a_deadline_only_policy_ends_a_stall_at_the_deadline() {
    let deadline = Duration::from_secs(10);
    let body = bytes_of(100, 4);
    let (svc, calls) = memory(vec![Answer {
        head_after: Duration::ZERO,
        len: 100,
        frames: vec![(Duration::ZERO, body.slice(..10))],
        stall: true,
    }]);
    let out = tokio::time::timeout(
        Duration::from_secs(3600),
        ServiceBuilder::new()
            .layer(policy().deadline(deadline).build().unwrap())
            .layer(ReadWholeLayer::new())
            .service(svc)
            .oneshot(req(Method::GET, "http://h/f", &[])),
    )
    .await
    .expect("no hang");
    let err = out.expect_err("the deadline ends the stall");
    assert!(all_said(&err).contains("deadline"), "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let (svc, calls) = memory(vec![Answer {
        head_after: Duration::ZERO,
        len: 100,
        frames: (0..10)
            .map(|i| (Duration::from_millis(900), body.slice(i * 10..i * 10 + 10)))
            .collect(),
        stall: false,
    }]);
    let res = ServiceBuilder::new()
        .layer(policy().deadline(deadline).build().unwrap())
        .layer(ReadWholeLayer::new())
        .service(svc)
        .oneshot(req(Method::GET, "http://h/f", &[]))
        .await
        .expect("within the deadline");
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(err.is_none());
    assert_eq!(bytes, body);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// **Hang.** A body of a known length within the limit that sends more than `MAX_FRAMES`
/// (1024) empty data frames, then stalls for good, under a per-attempt timeout and no deadline
/// (an HTTP/2 peer can send empty `DATA` frames).
///
/// What happens: each empty frame restarts `ReadWhole`'s per-frame wait, so the reading is not
/// cut; after 1024 of them `Reading::finish(true)` hands the rest on as a plain stream
/// (`WholeBody::then`), with no clock at all: the retry layer's timer was left to the reader
/// and is gone with the attempt, and the stream has no `Resume` (no idle timer). 1 call; the
/// caller's read never ends (here: until the test's hour of paused time).
///
/// Fixed (the fix proposed): when `ReadWhole` stops reading after `MAX_FRAMES`, keep timing the rest (hand it on
/// through `stream_on` with the attempt's clock, so it resumes or at least is cut by the
/// per-frame wait), or count empty frames against the per-frame wait instead of restarting it.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test(start_paused = true)]
async fn paused_many_empty_frames_then_a_stall_is_still_cut() {
    let (calls, out) = empty_frames_then_a_stall(1100).await;
    assert_eq!(calls, 1);
    let said = out.expect("the read of a stalled body ends");
    assert!(
        said.is_some(),
        "a body of 10 of its 100 bytes ended cleanly"
    );
}

/// The control: fewer empty frames than the cap, then a stall, is cut by the per-frame wait
/// (`max_retries(0)`: the body ends in the cut), 1 call.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test(start_paused = true)]
async fn paused_empty_frames_under_the_cap_then_a_stall_are_cut() {
    let (calls, out) = empty_frames_then_a_stall(1000).await;
    assert_eq!(calls, 1);
    let said = out.expect("the read of a stalled body ends");
    assert!(
        said.is_some(),
        "a body of 10 of its 100 bytes ended cleanly"
    );
}

/// `empty` empty frames, 10 bytes of 100, then nothing for good; per-attempt timeout 1 s, no
/// deadline, no retry. The calls made, and what the read said (`Err`: it hung for an hour).
async fn empty_frames_then_a_stall(
    empty: usize,
) -> (u32, Result<Option<String>, tokio::time::error::Elapsed>) {
    let t = Duration::from_secs(1);
    let mut frames: Vec<(Duration, Bytes)> =
        (0..empty).map(|_| (Duration::ZERO, Bytes::new())).collect();
    frames.push((Duration::ZERO, bytes_of(10, 5)));
    let (svc, calls) = memory(vec![Answer {
        head_after: Duration::ZERO,
        len: 100,
        frames,
        stall: true,
    }]);
    let read = async {
        let res = ServiceBuilder::new()
            .layer(policy().attempt_timeout(t).max_retries(0).build().unwrap())
            .layer(ReadWholeLayer::new())
            .service(svc)
            .oneshot(req(Method::GET, "http://h/f", &[]))
            .await;
        match res {
            Ok(res) => read_all(res.into_body()).await.1.map(|e| all_said(&*e)),
            Err(e) => Some(all_said(&e)),
        }
    };
    let out = tokio::time::timeout(Duration::from_secs(3600), read).await;
    (calls.load(Ordering::SeqCst), out)
}
