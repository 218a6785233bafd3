//! The replay buffer keeps handles to the caller's chunks, not copies, and nothing of a
//! request is left once it ends: counted with a global allocator that tallies this thread's
//! allocated bytes and the bytes still live.

use std::convert::Infallible;
use std::io;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, StreamBody};
use tower::{Layer, ServiceExt};
use tower_retry_safety::{RetryPolicy, RetryReport};

use retry_safety_testing::alloc::{allocated, live, Counting};

#[global_allocator]
static GLOBAL: Counting = Counting;

const CHUNK: usize = 4096;
const CHUNKS: usize = 8;

/// One streamed 32 KiB PUT whose first attempt reads the whole body and then fails: the
/// retry replays it. Returns (bytes allocated, bytes left live) during the request.
fn one_request(rt: &tokio::runtime::Runtime, policy: &RetryPolicy, chunks: &[Bytes]) -> (i64, i64) {
    let before = (allocated(), live());
    send(rt, policy, chunks);
    (allocated() - before.0, live() - before.1)
}

fn send(rt: &tokio::runtime::Runtime, policy: &RetryPolicy, chunks: &[Bytes]) {
    let frames: Vec<Result<Frame<Bytes>, Infallible>> =
        chunks.iter().map(|c| Ok(Frame::data(c.clone()))).collect();
    let body = StreamBody::new(futures_util::stream::iter(frames)).boxed();
    let req = Request::put("http://api.test/v1/files/1")
        .body(body)
        .unwrap();
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let inner = tower::service_fn(move |req: Request<BoxBody<Bytes, Infallible>>| {
        let calls = calls.clone();
        async move {
            let n = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // Read frame by frame: collecting would copy the chunks into one buffer.
            let (mut body, mut read) = (req.into_body(), 0);
            while let Some(frame) = body.frame().await {
                read += frame.unwrap().data_ref().map_or(0, |d| d.len());
            }
            assert_eq!(read, CHUNK * CHUNKS);
            if n == 0 {
                return Err(io::Error::from(io::ErrorKind::ConnectionReset));
            }
            Ok(Response::new(Empty::<Bytes>::new()))
        }
    });
    let res = rt.block_on(policy.layer(inner).oneshot(req)).unwrap();
    assert_eq!(RetryReport::of(&res).unwrap().attempts(), 2);
}

#[test]
fn the_recording_holds_handles_and_nothing_is_left_after_the_request() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let chunks: Vec<Bytes> = (0..CHUNKS)
        .map(|i| Bytes::from(vec![i as u8; CHUNK]))
        .collect();
    let policy = RetryPolicy::builder()
        .backoff(Duration::from_millis(1), Duration::from_millis(1))
        .jitter(false)
        .no_budget()
        .build()
        .unwrap();
    // The first request warms up what the runtime allocates once (its timer wheel).
    one_request(&rt, &policy, &chunks);
    let (allocated, live) = one_request(&rt, &policy, &chunks);
    println!("one streamed 32 KiB PUT, retried once: {allocated} bytes allocated, {live} left");
    // The request, the future, the attempts and the recording's bookkeeping: far
    // below one copy of the body (32 KiB), which a copying buffer would add.
    assert!(allocated < 8 * 1024, "{allocated} bytes allocated");
    assert_eq!(live, 0, "the request left {live} bytes live");
    for chunk in &chunks {
        assert!(chunk.is_unique(), "a chunk is still held");
    }
}
