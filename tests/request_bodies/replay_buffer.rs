//! The replay buffer through the layer: streaming bodies recorded as they are sent, replayed on
//! a retry and continued from where the last attempt stopped, never a byte twice or lost.

use std::io;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::{Body, Frame};
use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
use http_body_util::{BodyExt, Either, Full, StreamBody};
use proptest::prelude::*;
use tower::{Layer, Service, ServiceExt};
use tower_retry_safety::{
    NoRetry, NotReplayable, Replayable, RequestOptions, RetryPolicy, RetryReport, StopReason,
};

type Chunks = Vec<Vec<u8>>;
type Stream = StreamBody<futures_util::stream::Iter<std::vec::IntoIter<io::Result<Frame<Bytes>>>>>;

/// How one attempt ends, after the inner service read `frames` frames of its body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Ok,
    /// The connection reset: ambiguous, and a PUT is retried.
    Reset,
    /// A 503: retried for a PUT, if the body was sent to its end.
    Unavailable,
}

/// What one attempt's inner service received.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Received {
    data: Vec<Bytes>,
    trailers: Option<HeaderMap>,
    /// It read past the last frame.
    saw_end: bool,
    /// What the body's size hint said when the attempt started.
    exact_len: Option<u64>,
}

/// An inner service that reads `frames` frames of each attempt's body, drops the body, then
/// ends the attempt as planned.
#[derive(Clone)]
struct Reader {
    plan: Arc<Vec<(usize, End)>>,
    log: Arc<Mutex<Vec<Received>>>,
    /// Keep each attempt's body instead of dropping it (a transport that holds on to it).
    hold: Arc<Mutex<Vec<Box<dyn std::any::Any + Send>>>>,
    holds: bool,
}

impl Reader {
    fn new(plan: Vec<(usize, End)>) -> Reader {
        Reader {
            plan: Arc::new(plan),
            log: Arc::default(),
            hold: Arc::default(),
            holds: false,
        }
    }

    fn received(&self) -> Vec<Received> {
        self.log.lock().unwrap().clone()
    }
}

impl<B> Service<Request<B>> for Reader
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::fmt::Debug,
{
    type Response = Response<Full<Bytes>>;
    type Error = io::Error;
    type Future = BoxFuture<'static, Result<Self::Response, io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let me = self.clone();
        Box::pin(async move {
            let attempt = me.log.lock().unwrap().len();
            let (frames, end) = me.plan[attempt];
            let mut body = req.into_body();
            let mut got = Received {
                exact_len: body.size_hint().exact(),
                ..Received::default()
            };
            for _ in 0..frames {
                match body.frame().await {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => got.data.push(data),
                        Err(frame) => got.trailers = frame.into_trailers().ok(),
                    },
                    Some(Err(e)) => panic!("the body failed: {e:?}"),
                    None => {
                        got.saw_end = true;
                        break;
                    }
                }
            }
            me.log.lock().unwrap().push(got);
            if me.holds {
                me.hold.lock().unwrap().push(Box::new(body));
            } else {
                drop(body);
            }
            match end {
                End::Ok => Ok(Response::new(Full::new(Bytes::from_static(b"ok")))),
                End::Reset => Err(io::Error::from(io::ErrorKind::ConnectionReset)),
                End::Unavailable => {
                    let mut res = Response::new(Full::default());
                    *res.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
                    Ok(res)
                }
            }
        })
    }
}

fn policy(limit: usize) -> RetryPolicy {
    RetryPolicy::builder()
        .max_retries(3)
        .jitter(false)
        .backoff(Duration::from_millis(10), Duration::from_millis(10))
        .no_budget()
        .replay_buffer(limit)
        .build()
        .unwrap()
}

fn frames(chunks: &Chunks, trailers: bool) -> Vec<io::Result<Frame<Bytes>>> {
    let mut frames: Vec<_> = chunks
        .iter()
        .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
        .collect();
    if trailers {
        frames.push(Ok(Frame::trailers(trailer_map())));
    }
    frames
}

fn trailer_map() -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert("x-checksum", HeaderValue::from_static("abc"));
    t
}

fn stream(chunks: &Chunks, trailers: bool) -> Stream {
    StreamBody::new(futures_util::stream::iter(frames(chunks, trailers)))
}

fn put<B>(body: B) -> Request<B> {
    Request::put("http://api.test/v1/files/1")
        .body(body)
        .unwrap()
}

async fn send<B>(
    policy: RetryPolicy,
    reader: &Reader,
    req: Request<B>,
) -> Result<Response<Full<Bytes>>, tower_retry_safety::Error>
where
    Reader: Service<Request<B>, Response = Response<Full<Bytes>>, Error = io::Error>,
    <Reader as Service<Request<B>>>::Future: Send,
    B: tower_retry_safety::ReplayBody,
{
    policy.layer(reader.clone()).oneshot(req).await
}

fn report<T>(out: &Result<Response<T>, tower_retry_safety::Error>) -> RetryReport {
    match out {
        Ok(res) => RetryReport::of(res).unwrap().clone(),
        Err(e) => e.report().unwrap().clone(),
    }
}

/// The whole body as frames: what every complete attempt must receive.
fn whole(chunks: &Chunks, trailers: bool) -> Received {
    Received {
        data: chunks.iter().map(|c| Bytes::copy_from_slice(c)).collect(),
        trailers: trailers.then(trailer_map),
        saw_end: true,
        exact_len: None,
    }
}

/// What the model expects of a run: each attempt's frames, and why it stopped. It plays the
/// recording as the layer should: an attempt is sent the recorded data chunks (empty ones are
/// not kept: they send nothing), then the caller's body from where the last attempt stopped,
/// then the recorded trailers; the caller's body counts as ended once any attempt has read its
/// trailers or asked it for a frame past its last. Each kept chunk costs its bytes and its handle against the limit;
/// past it the recording is dropped and never replayed.
fn model(
    chunks: &Chunks,
    trailers: bool,
    limit: usize,
    plan: &[(usize, End)],
) -> (Vec<Received>, Option<NotReplayable>) {
    let n = chunks.len();
    let total = n + trailers as usize;
    let all = whole(chunks, trailers);
    // Frames taken from the caller's body so far, and whether it was asked past its end.
    let (mut consumed, mut ended) = (0usize, false);
    let (mut recorded, mut kept, mut over) = (Vec::<Bytes>::new(), 0usize, false);
    let mut out = Vec::new();
    for (i, &(frames, end)) in plan.iter().enumerate() {
        let mut got = Received::default();
        let (mut replayed, mut trailers_sent) = (0usize, false);
        for _ in 0..frames {
            if replayed < recorded.len() {
                got.data.push(recorded[replayed].clone());
                replayed += 1;
            } else if consumed < total {
                if consumed < n {
                    let chunk = all.data[consumed].clone();
                    got.data.push(chunk.clone());
                    let cost = chunk.len() + std::mem::size_of::<Bytes>();
                    if over || chunk.is_empty() {
                    } else if kept + cost <= limit {
                        kept += cost;
                        recorded.push(chunk);
                        replayed += 1;
                    } else {
                        over = true;
                        recorded.clear();
                        replayed = 0;
                    }
                } else {
                    // Trailers are the last frame: the caller's body has ended.
                    got.trailers = all.trailers.clone();
                    trailers_sent = true;
                    ended = true;
                }
                consumed += 1;
            } else {
                ended = true;
                if trailers && !trailers_sent {
                    got.trailers = all.trailers.clone();
                    trailers_sent = true;
                } else {
                    got.saw_end = true;
                    break;
                }
            }
        }
        out.push(got);
        let why = match end {
            End::Ok => return (out, None),
            _ if over => Some(NotReplayable::OverLimit { limit }),
            End::Unavailable if !ended => Some(NotReplayable::ResponseBeforeEnd),
            _ => None,
        };
        if why.is_some() || i == 3 {
            return (out, why);
        }
    }
    unreachable!("the plan has four attempts")
}

fn run_case(chunks: Chunks, trailers: bool, limit: usize, plan: Vec<(usize, End)>, boxed: bool) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let (expected, why) = model(&chunks, trailers, limit, &plan);
    let reader = Reader::new(plan.clone());
    let out = rt.block_on(async {
        if boxed {
            let body = stream(&chunks, trailers).boxed();
            send(policy(limit), &reader, put(body)).await
        } else {
            let body = Replayable::new(stream(&chunks, trailers));
            send(policy(limit), &reader, put(body)).await
        }
    });
    let mut got = reader.received();
    for g in &mut got {
        g.exact_len = None;
    }
    assert_eq!(got, expected, "plan {plan:?}");
    let report = report(&out);
    assert_eq!(report.attempts() as usize, expected.len());
    assert_eq!(report.body_not_replayable(), why);
    if why.is_some() {
        assert_eq!(report.stop_reason(), StopReason::BodyNotReplayable);
    }
}

fn end() -> impl Strategy<Value = End> {
    prop_oneof![Just(End::Ok), Just(End::Reset), Just(End::Unavailable)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Any chunking (empty chunks too), trailers or not, an attempt cut at any frame, up to
    /// four attempts: each attempt receives the body's own frames, in order, none twice and
    /// none lost, and a body past the limit is never sent again.
    #[test]
    fn every_attempt_receives_the_body_as_it_was(
        chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..8),
        trailers in any::<bool>(),
        limit in prop_oneof![Just(64 * 1024), 1usize..200],
        plan in prop::collection::vec((0usize..12, end()), 4),
        boxed in any::<bool>(),
    ) {
        run_case(chunks, trailers, limit, plan, boxed);
    }
}

/// linkerd2-proxy PR 4621: a retry that started from an empty recording (the first attempt
/// read nothing) sent each chunk twice — once as it read it, once more from the recording.
#[test]
fn a_retry_after_an_attempt_that_read_nothing_sends_each_byte_once() {
    let chunks: Chunks = vec![b"ab".to_vec(), b"cd".to_vec(), b"ef".to_vec()];
    for boxed in [false, true] {
        run_case(
            chunks.clone(),
            false,
            64 * 1024,
            vec![(0, End::Reset), (9, End::Reset), (9, End::Ok), (0, End::Ok)],
            boxed,
        );
    }
}

/// An upload cut in the middle is retried: the retry replays what was sent and reads the rest
/// from the caller's body.
#[tokio::test(start_paused = true)]
async fn an_upload_cut_in_the_middle_is_replayed_then_continued() {
    let chunks: Chunks = (0..6).map(|i| vec![i as u8; 100]).collect();
    let reader = Reader::new(vec![(3, End::Reset), (99, End::Ok)]);
    let body = stream(&chunks, true).boxed();
    let res = send(policy(64 * 1024), &reader, put(body)).await.unwrap();
    let got = reader.received();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].data.len(), 3);
    assert_eq!(
        Received {
            exact_len: None,
            ..got[1].clone()
        },
        whole(&chunks, true)
    );
    assert_eq!(RetryReport::of(&res).unwrap().attempts(), 2);
}

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

/// A retry replays the exact size the first attempt declared, so a transport sends the same
/// content-length again.
#[tokio::test(start_paused = true)]
async fn a_replay_keeps_the_exact_size_hint() {
    let body = Full::new(Bytes::from_static(b"0123456789"))
        .map_err(|never| match never {})
        .boxed();
    let reader = Reader::new(vec![(1, End::Reset), (99, End::Reset), (99, End::Ok)]);
    send(policy(1024), &reader, put(body)).await.unwrap();
    let got = reader.received();
    let hints: Vec<_> = got.iter().map(|g| g.exact_len).collect();
    assert_eq!(hints, [Some(10), Some(10), Some(10)]);
    assert_eq!(got[2].data.concat(), b"0123456789");
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

/// `UnsyncBoxBody` and `Either` record as `BoxBody` does.
#[tokio::test(start_paused = true)]
async fn unsync_boxed_and_either_bodies_are_replayed() {
    let chunks: Chunks = vec![b"left".to_vec(), b"right".to_vec()];
    let reader = Reader::new(vec![(1, End::Reset), (99, End::Ok)]);
    let body: UnsyncBoxBody<Bytes, io::Error> = stream(&chunks, false).boxed_unsync();
    send(policy(1024), &reader, put(body)).await.unwrap();
    assert_eq!(reader.received()[1].data.concat(), b"leftright");

    let reader = Reader::new(vec![(1, End::Reset), (99, End::Ok)]);
    let body: Either<BoxBody<Bytes, io::Error>, Full<Bytes>> =
        Either::Left(stream(&chunks, false).boxed());
    let out = policy(1024).layer(reader.clone()).oneshot(put(body)).await;
    assert_eq!(RetryReport::of(&out.unwrap()).unwrap().attempts(), 2);
    assert_eq!(reader.received()[1].data.concat(), b"leftright");
}

/// The recording holds the caller's chunks, not copies, and lets go of them when the request
/// ends — also when the transport still holds the last attempt's body (then at its next
/// frame).
#[tokio::test(start_paused = true)]
async fn the_recording_shares_the_chunks_and_lets_go_when_the_request_ends() {
    let (a, b) = (Bytes::from(vec![5u8; 4096]), Bytes::from(vec![6u8; 4096]));
    let frames: Vec<io::Result<_>> = vec![Ok(Frame::data(a.clone())), Ok(Frame::data(b.clone()))];
    let body = StreamBody::new(futures_util::stream::iter(frames)).boxed();
    // Each attempt reads one chunk; the server answers the second with 200 and its
    // transport keeps the body, as hyper does while it is still sending it.
    let mut reader = Reader::new(vec![(1, End::Reset), (1, End::Ok)]);
    reader.holds = true;
    // The first attempt's body is let go of during the backoff, as a transport would.
    let hold = reader.hold.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(5)).await;
        hold.lock().unwrap().clear();
    });
    let res = send(policy(64 * 1024), &reader, put(body)).await.unwrap();
    assert_eq!(RetryReport::of(&res).unwrap().attempts(), 2);
    // The chunk the retry sent is the caller's own bytes, not a copy.
    assert_eq!(reader.received()[1].data[0].as_ptr(), a.as_ptr());
    reader.log.lock().unwrap().clear();
    assert!(!a.is_unique(), "the held body's recording has it");
    // The request has ended: at its next frame the held body drops the recording and goes on
    // with the caller's body.
    let mut held = reader.hold.lock().unwrap().pop().unwrap();
    let body = held.downcast_mut::<BoxBody<Bytes, io::Error>>().unwrap();
    let next = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(next.as_ptr(), b.as_ptr());
    drop(next);
    assert!(a.is_unique(), "the recording still holds the first chunk");
    drop(held);
    assert!(b.is_unique());
}

#[test]
fn a_replay_buffer_over_a_gibibyte_fails_to_build() {
    let err = RetryPolicy::builder()
        .replay_buffer(2 << 30)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("replay_buffer"), "{err}");
}
