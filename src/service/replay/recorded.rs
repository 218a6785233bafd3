use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::Body;

use super::tape::{HoldsRecording, Playback, Recording, RecordingHandle};
use super::{NotReplayable, Replayable};

/// The replay buffer a request gets: what [`ReplayBody::record`](crate::service::ReplayBody::record)
/// passes on to [`Recorded::stream`].
#[derive(Clone, Copy)]
pub struct ReplayBuffer {
    pub(crate) limit: usize,
    /// The request's content-length, if it has one.
    pub(crate) declared_len: Option<u64>,
}

/// The limit only: the declared length comes from a header.
impl fmt::Debug for ReplayBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplayBuffer")
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl ReplayBuffer {
    /// The most bytes kept for replay: the policy's
    /// [`replay_buffer`](crate::RetryPolicyBuilder::replay_buffer).
    pub fn limit(&self) -> usize {
        self.limit
    }
}

/// A request body made ready for its first attempt, and what the layer keeps to send it again:
/// what [`ReplayBody::record`](crate::service::ReplayBody::record) returns.
pub struct Recorded<T> {
    body: T,
    replays: Result<Arc<dyn NextBody<T>>, NotReplayable>,
}

impl<T> Recorded<T> {
    /// A body sent once, as it is: the layer keeps nothing of it.
    pub fn once(body: T) -> Self {
        Recorded {
            body,
            replays: Err(NotReplayable::Stream),
        }
    }

    /// Records `body` as it streams, up to `buffer`'s limit; `wrap` makes the body type the
    /// inner service takes out of each attempt's [`Replayable`] (`BoxBody::new` for a client
    /// built for `BoxBody`). A body whose size hint is already over the limit is not recorded.
    pub fn stream<B>(body: B, buffer: &ReplayBuffer, wrap: fn(Replayable<B>) -> T) -> Self
    where
        B: Body + Unpin + Send + 'static,
        B::Data: Clone + Send,
        T: 'static,
    {
        let hint = body.size_hint();
        if hint.lower() > buffer.limit as u64 {
            return Recorded {
                body: wrap(Replayable::new(body)),
                replays: Err(NotReplayable::OverLimit {
                    limit: buffer.limit,
                }),
            };
        }
        let declared_len = buffer.declared_len.or(hint.exact());
        let deck = Arc::new(WrappedRecording {
            recording: Recording::new(buffer.limit, declared_len),
            wrap,
        });
        let handle: RecordingHandle<B> = deck.clone();
        Recorded {
            body: wrap(Replayable::playing(Playback::first(handle, body))),
            replays: Ok(deck),
        }
    }

    /// The same recording, handed on as another body type (each `Either` variant, say).
    pub fn map<U>(self, f: fn(T) -> U) -> Recorded<U>
    where
        T: 'static,
        U: 'static,
    {
        Recorded {
            body: f(self.body),
            replays: self
                .replays
                .map(|inner| Arc::new(Mapped { inner, f }) as Arc<dyn NextBody<U>>),
        }
    }

    /// The first attempt's body, and the replays of it, or why there are none.
    pub(crate) fn into_parts(self) -> (T, Result<Replays<T>, NotReplayable>) {
        (self.body, self.replays.map(Replays))
    }
}

impl<T> fmt::Debug for Recorded<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recorded")
            .field("replayable", &self.replays.is_ok())
            .finish_non_exhaustive()
    }
}

/// The recording, as the layer drives it. Dropping it ends the recording: what is kept is
/// freed now, or when the body that holds it next sends a frame.
pub(crate) struct Replays<T>(Arc<dyn NextBody<T>>);

impl<T> Replays<T> {
    /// Whether another attempt could be sent after the last one, which ended in a response
    /// (`responded`) or an error.
    pub(crate) fn check(&self, responded: bool) -> Result<(), NotReplayable> {
        self.0.check(responded)
    }

    /// The next attempt's body, once the last attempt's transport has let go of the
    /// recording (or why it cannot be replayed after all).
    pub(crate) fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Result<T, NotReplayable>> {
        Arc::clone(&self.0).poll_next(cx)
    }
}

impl<T> Drop for Replays<T> {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// The recording without its body type, so that `Recorded<T>` names only the type the inner
/// service takes.
trait NextBody<T>: Send + Sync {
    fn check(&self, responded: bool) -> Result<(), NotReplayable>;
    /// Takes the handle by `Arc`: a player keeps one to its recording.
    fn poll_next(self: Arc<Self>, cx: &mut Context<'_>) -> Poll<Result<T, NotReplayable>>;
    fn close(&self);
}

/// The recording and the way to hand it to the inner service, in one allocation.
struct WrappedRecording<B: Body, T> {
    recording: Recording<B>,
    wrap: fn(Replayable<B>) -> T,
}

impl<B, T> HoldsRecording<B> for WrappedRecording<B, T>
where
    B: Body + Send + 'static,
    B::Data: Send,
    T: 'static,
{
    fn recording(&self) -> &Recording<B> {
        &self.recording
    }
}

impl<B, T> NextBody<T> for WrappedRecording<B, T>
where
    B: Body + Send + 'static,
    B::Data: Send,
    T: 'static,
{
    fn check(&self, responded: bool) -> Result<(), NotReplayable> {
        self.recording.check(responded)
    }

    fn poll_next(self: Arc<Self>, cx: &mut Context<'_>) -> Poll<Result<T, NotReplayable>> {
        let wrap = self.wrap;
        let handle: RecordingHandle<B> = self.clone();
        self.recording
            .poll_playback(handle, cx)
            .map_ok(|player| wrap(Replayable::playing(player)))
    }

    fn close(&self) {
        self.recording.close();
    }
}

struct Mapped<T, U> {
    inner: Arc<dyn NextBody<T>>,
    f: fn(T) -> U,
}

impl<T, U> NextBody<U> for Mapped<T, U> {
    fn check(&self, responded: bool) -> Result<(), NotReplayable> {
        self.inner.check(responded)
    }

    fn poll_next(self: Arc<Self>, cx: &mut Context<'_>) -> Poll<Result<U, NotReplayable>> {
        Arc::clone(&self.inner).poll_next(cx).map_ok(self.f)
    }

    fn close(&self) {
        self.inner.close();
    }
}
