//! The recording's memory stays near the limit however the body is cut: empty chunks are not
//! kept, and each kept chunk's handle counts (found by an adversarial review).
//! Counted with a global allocator that tallies this thread's live bytes.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, StreamBody};
use tower::{Layer, ServiceExt};
use tower_retry_safety::RetryPolicy;

use retry_safety_testing::alloc::{live, Counting};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Live bytes the layer holds, for a streamed PUT of `chunks`, once the first attempt has
/// read the whole body (measured inside the inner service, before it answers).
fn held_while_recording(
    limit: usize,
    chunks: impl Iterator<Item = Bytes> + Send + Sync + 'static,
) -> i64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let policy = RetryPolicy::builder()
        .max_retries(1)
        .backoff(Duration::from_millis(1), Duration::from_millis(1))
        .no_budget()
        .replay_buffer(limit)
        .build()
        .unwrap();
    // Made as they are read: the source itself holds no memory.
    let frames = chunks.map(|c| Ok::<_, Infallible>(Frame::data(c)));
    let body = StreamBody::new(futures_util::stream::iter(frames)).boxed();
    let req = Request::put("http://api.test/v1/files/1")
        .body(body)
        .unwrap();
    let held = Arc::new(Mutex::new(None));
    let seen = held.clone();
    let before = live();
    let inner = tower::service_fn(move |req: Request<BoxBody<Bytes, Infallible>>| {
        let seen = seen.clone();
        async move {
            let mut body = req.into_body();
            while let Some(frame) = body.frame().await {
                drop(frame);
            }
            seen.lock().unwrap().get_or_insert(live());
            drop(body);
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        }
    });
    rt.block_on(policy.layer(inner).oneshot(req)).unwrap();
    let at = held.lock().unwrap().expect("the inner service ran");
    at - before
}

/// Found in review, fixed: zero-length data frames count 0 bytes against `replay_buffer` but each takes a
/// slot (a `Bytes`, 32 bytes) in the recording. 200,000 empty chunks then 10 bytes, with a
/// 1 KiB buffer: the recording holds megabytes, and grows without bound with the frame count.
#[test]
fn empty_chunks_do_not_grow_the_recording_past_the_limit() {
    let limit = 1024;
    let chunks = std::iter::repeat_n(Bytes::new(), 200_000)
        .chain(std::iter::once(Bytes::from_static(b"0123456789")));
    let held = held_while_recording(limit, chunks);
    // Generous: the recording's bookkeeping may cost a few times the limit, not 6,000 times.
    assert!(
        held < 16 * limit as i64,
        "held {held} bytes for a {limit}-byte buffer"
    );
}

/// Found in review (amplification), fixed: each recorded chunk costs a 32-byte `Bytes` in the recording on
/// top of its data, so the memory a request pins is not bounded by `replay_buffer` but by 33x
/// it for 1-byte chunks (a proxied client that sends 1-byte chunks: 6 bytes each on the wire
/// with h1 chunked encoding). 65,536 1-byte chunks under the default 64 KiB buffer.
#[test]
fn one_byte_chunks_do_not_grow_the_recording_far_past_the_limit() {
    let limit = 64 * 1024;
    let chunks = std::iter::repeat_n(Bytes::from_static(b"x"), limit);
    let held = held_while_recording(limit, chunks);
    assert!(
        held < 4 * limit as i64,
        "held {held} bytes for a {limit}-byte buffer"
    );
}
