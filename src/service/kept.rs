use std::task::{Context, Poll};

use http::header::CONTENT_LENGTH;
use http::HeaderMap;

use super::body::ReplayBody;
use super::replay::{NotReplayable, ReplayBuffer, Replays};

/// What the layer keeps to send a request's body again.
pub(crate) enum Kept<B> {
    /// A copy, copied again for each retry.
    Copy(B),
    /// A recording of the body as it streams.
    Recorded(Replays<B>),
}

/// Records a body that cannot be copied (`try_clone_body` gave `None`), up to `limit` bytes
/// (0: none), for the retries. Returns the body for the first attempt.
pub(crate) fn keep_stream<B: ReplayBody>(
    body: B,
    headers: &HeaderMap,
    limit: usize,
) -> (B, Result<Kept<B>, NotReplayable>) {
    if limit == 0 {
        return (body, Err(NotReplayable::Stream));
    }
    let declared_len = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let buffer = ReplayBuffer {
        limit,
        declared_len,
    };
    let (body, replays) = body.record(&buffer).into_parts();
    (body, replays.map(Kept::Recorded))
}

impl<B: ReplayBody> Kept<B> {
    /// Whether another attempt could be sent after the last one, which ended in a response
    /// (`responded`) or an error.
    #[inline]
    pub(crate) fn check(&self, responded: bool) -> Result<(), NotReplayable> {
        match self {
            Kept::Copy(_) => Ok(()),
            Kept::Recorded(replays) => replays.check(responded),
        }
    }

    /// Whether the next body may have to wait for the last attempt to let go of it.
    pub(crate) fn is_recording(&self) -> bool {
        matches!(self, Kept::Recorded(_))
    }

    /// The next attempt's body from a copy, or from a recording that is free now (a copy never
    /// waits; a recording still held counts as [`NotReplayable::StillInUse`]).
    pub(crate) fn copy(&self) -> Result<B, NotReplayable> {
        match self {
            // A body that copied once but not twice is treated as a stream.
            Kept::Copy(copy) => copy.try_clone_body().ok_or(NotReplayable::Stream),
            Kept::Recorded(replays) => {
                let mut cx = Context::from_waker(std::task::Waker::noop());
                match replays.poll_next(&mut cx) {
                    Poll::Ready(next) => next,
                    Poll::Pending => Err(NotReplayable::StillInUse),
                }
            }
        }
    }

    /// The next attempt's body: pending while the last attempt's transport holds a recording.
    pub(crate) fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Result<B, NotReplayable>> {
        match self {
            // A body that copied once but not twice is treated as a stream.
            Kept::Copy(copy) => Poll::Ready(copy.try_clone_body().ok_or(NotReplayable::Stream)),
            Kept::Recorded(replays) => replays.poll_next(cx),
        }
    }
}
