//! The replay buffer through the layer, against a model of the recording: any chunking (empty
//! chunks too), trailers or not, an attempt cut at any frame, up to four attempts: each attempt
//! receives the body's own frames, in order, never a byte twice or lost, and a body past the limit
//! is never sent again (and linkerd2-proxy PR 4621's regression).

use crate::replay_reader::{
    policy, put, report, send, stream, whole, Chunks, End, Reader, Received,
};
use bytes::Bytes;
use http_body_util::BodyExt;
use proptest::prelude::*;
use tower_retry_safety::service::{NotReplayable, Replayable};
use tower_retry_safety::StopReason;

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
