//! What the replay buffer's edge cases share: the boxed body type, a policy with a replay
//! buffer, and a body of numbered chunks that may fail.

use std::io;
use std::time::Duration;

use bytes::Bytes;
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::StreamBody;
use tower_retry_safety::RetryPolicy;

pub(crate) type Boxed = UnsyncBoxBody<Bytes, io::Error>;

pub(crate) fn policy(limit: usize) -> tower_retry_safety::RetryPolicyBuilder {
    RetryPolicy::builder()
        .max_retries(3)
        .jitter(false)
        .backoff(Duration::from_millis(10), Duration::from_millis(10))
        .no_budget()
        .replay_buffer(limit)
}

/// `n` chunks of `size` bytes, byte `i` of the body being `i % 251`; then `tail` (an error).
pub(crate) fn body(n: usize, size: usize, fail_after: Option<usize>) -> (Boxed, Bytes) {
    let all: Vec<u8> = (0..n * size).map(|i| (i % 251) as u8).collect();
    let mut frames: Vec<io::Result<Frame<Bytes>>> = all
        .chunks(size)
        .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
        .collect();
    if let Some(k) = fail_after {
        frames.truncate(k);
        frames.push(Err(io::Error::other("the upload's source failed")));
    }
    let body = StreamBody::new(futures_util::stream::iter(frames));
    (UnsyncBoxBody::new(body), Bytes::from(all))
}
