//! The recording itself: what a streaming body has sent so far, shared by the attempts of
//! one request, and the player that streams it to one attempt.

use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use bytes::Buf;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use super::NotReplayable;

/// What is known of a recording while an attempt's body holds its tape: flags that are only
/// ever set, never cleared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Flags(u8);

impl Flags {
    /// The caller's body has been read to its end (trailers included).
    const ENDED: Flags = Flags(1);
    /// The body streamed past the limit: the tape was emptied.
    const OVER_LIMIT: Flags = Flags(2);
    /// Reading the caller's body failed.
    const FAILED: Flags = Flags(4);
    /// The request's future ended: nothing more is worth keeping.
    const CLOSED: Flags = Flags(8);

    /// Whether any of `flags` is set.
    fn any(self, flags: Flags) -> bool {
        self.0 & flags.0 != 0
    }

    fn and(self, other: Flags) -> Flags {
        Flags(self.0 | other.0)
    }
}

/// [`Flags`] shared by a recording's attempts.
struct AtomicFlags(AtomicU8);

impl AtomicFlags {
    fn load(&self) -> Flags {
        Flags(self.0.load(Ordering::Acquire))
    }

    fn set(&self, flags: Flags) {
        self.0.fetch_or(flags.0, Ordering::AcqRel);
    }
}

/// One request's recording, shared by its attempts' bodies and the layer.
pub(crate) struct Recording<B: Body> {
    home: Mutex<Home<B>>,
    limit: usize,
    /// The body's length, when the request declared it (content-length or an exact size
    /// hint). hyper stops reading a body once that many bytes are sent, without asking it
    /// for its end, so reaching the length counts as the end.
    declared_len: Option<u64>,
    /// What is known of the recording while an attempt's body holds the tape.
    flags: AtomicFlags,
}

struct Home<B: Body> {
    /// The tape, when no attempt's body holds it.
    tape: Option<Tape<B>>,
    /// The layer, waiting for the last attempt's body to give the tape back.
    waiting: Option<Waker>,
}

impl<B: Body> Tape<B> {
    /// Frees what was recorded (past the limit, or once the request is over).
    fn clear(&mut self) {
        self.data = Vec::new();
        self.bytes = 0;
        self.kept = 0;
    }
}

struct Tape<B: Body> {
    /// The data frames sent so far, as the caller's own chunks (handles, not copies); emptied
    /// when the body streams past the limit.
    data: Vec<B::Data>,
    /// Boxed: trailers are rare, and a tape moves with each attempt's body.
    trailers: Option<Box<HeaderMap>>,
    /// Bytes in `data`.
    bytes: usize,
    /// What `data` costs against the limit: its bytes and each chunk's handle.
    kept: usize,
    /// Bytes read from the caller's body so far, recorded or not.
    read: u64,
    /// The caller's body from where the last attempt stopped reading; `None` once it ended or
    /// failed.
    rest: Option<B>,
}

/// What holds a request's recording: the layer's handle (one allocation for both, whatever
/// body type the inner service takes).
pub(crate) trait HoldsRecording<B: Body>: Send + Sync {
    fn recording(&self) -> &Recording<B>;
}

/// The recording's handle, as each attempt's body sees it.
pub(crate) type RecordingHandle<B> = Arc<dyn HoldsRecording<B>>;

impl<B: Body> Recording<B> {
    /// A recording of `body`, its tape out with the first attempt: build the first player with
    /// [`Playback::first`] once the holder is made.
    pub(crate) fn new(limit: usize, declared_len: Option<u64>) -> Self {
        Recording {
            home: Mutex::new(Home {
                tape: None,
                waiting: None,
            }),
            limit,
            declared_len,
            flags: AtomicFlags(AtomicU8::new(0)),
        }
    }

    fn home(&self) -> MutexGuard<'_, Home<B>> {
        // Nothing panics while holding the lock; a poisoned one still holds a whole tape.
        self.home.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn flags(&self) -> Flags {
        self.flags.load()
    }

    fn set(&self, flags: Flags) {
        self.flags.set(flags);
    }

    /// Whether another attempt could be sent after the last one, which ended in a response
    /// (`responded`) or an error.
    pub(crate) fn check(&self, responded: bool) -> Result<(), NotReplayable> {
        let flags = self.flags();
        if flags.any(Flags::OVER_LIMIT) {
            return Err(NotReplayable::OverLimit { limit: self.limit });
        }
        if flags.any(Flags::FAILED) {
            return Err(NotReplayable::BodyFailed);
        }
        // The server answered before it had the whole body: it did not wait for it, and the
        // rest may still be on its way to it (linkerd's rule).
        if responded && !flags.any(Flags::ENDED) {
            return Err(NotReplayable::ResponseBeforeEnd);
        }
        Ok(())
    }

    /// A player for the next attempt, once the last attempt's body has given the tape back —
    /// unless that body went past the limit or failed in the meantime (a transport may go on
    /// reading a body after it reported the attempt's failure).
    pub(crate) fn poll_playback(
        &self,
        handle: RecordingHandle<B>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Playback<B>, NotReplayable>> {
        let mut home = self.home();
        match home.tape.take() {
            Some(tape) => {
                home.waiting = None;
                // The last player is gone: its flags are final.
                if let Err(why) = self.check(false) {
                    home.tape = Some(tape);
                    return Poll::Ready(Err(why));
                }
                Poll::Ready(Ok(Playback::new(handle, tape)))
            }
            None => {
                home.waiting = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    /// The request is over: a body that still holds the recording drops it when it next sends
    /// a frame, and does not give it back. A recording at home goes with the layer's handle,
    /// the last one then (no body holds another), so there is nothing to take here.
    pub(crate) fn close(&self) {
        self.set(Flags::CLOSED);
    }
}

/// Streams the recording to one attempt, then the caller's body from where the last attempt
/// stopped, recording it as it goes.
pub(crate) struct Playback<B: Body> {
    handle: RecordingHandle<B>,
    /// Always `Some` until dropped, when the tape goes back home.
    tape: Option<Tape<B>>,
    /// Recorded data frames this attempt has been sent.
    next: usize,
    /// Bytes of the recording this attempt has yet to be sent.
    replay_left: u64,
    trailers_sent: bool,
}

impl<B: Body> Playback<B> {
    /// The first attempt's player: it takes the caller's body, nothing recorded yet.
    pub(crate) fn first(handle: RecordingHandle<B>, body: B) -> Self {
        let tape = Tape {
            data: Vec::new(),
            trailers: None,
            bytes: 0,
            kept: 0,
            read: 0,
            rest: Some(body),
        };
        Playback::new(handle, tape)
    }

    fn new(handle: RecordingHandle<B>, tape: Tape<B>) -> Self {
        let replay_left = tape.bytes as u64;
        Playback {
            handle,
            tape: Some(tape),
            next: 0,
            replay_left,
            trailers_sent: false,
        }
    }
}

impl<B> Playback<B>
where
    B: Body + Unpin,
    B::Data: Clone,
{
    /// The recording first, then the caller's body from where the last attempt stopped
    /// (recorded as it goes), then the recorded trailers.
    pub(crate) fn poll_frame(&mut self, cx: &mut Context<'_>) -> PolledFrame<B> {
        let Some(tape) = self.tape.as_mut() else {
            return Poll::Ready(None);
        };
        if let Some(chunk) = tape.data.get(self.next) {
            self.next += 1;
            // Saturating: a chunk type whose clones share a read position must not panic here.
            self.replay_left = self.replay_left.saturating_sub(chunk.remaining() as u64);
            return Poll::Ready(Some(Ok(Frame::data(chunk.clone()))));
        }
        let recording = self.handle.recording();
        let flags = recording.flags();
        if flags.any(Flags::CLOSED) && tape.bytes > 0 {
            // The request is over and this attempt has sent the recording: free it now, not
            // when the transport drops the body.
            tape.clear();
            self.next = 0;
        }
        if let Some(rest) = tape.rest.as_mut() {
            match Pin::new(&mut *rest).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(frame))) => {
                    let keep = !flags.any(Flags::OVER_LIMIT.and(Flags::CLOSED));
                    self.record(&frame, keep);
                    return Poll::Ready(Some(Ok(frame)));
                }
                Poll::Ready(Some(Err(err))) => {
                    tape.rest = None;
                    recording.set(Flags::FAILED);
                    return Poll::Ready(Some(Err(err)));
                }
                Poll::Ready(None) => {
                    tape.rest = None;
                    recording.set(Flags::ENDED);
                }
            }
        }
        if !self.trailers_sent {
            self.trailers_sent = true;
            if let Some(trailers) = &tape.trailers {
                return Poll::Ready(Some(Ok(Frame::trailers(HeaderMap::clone(trailers)))));
            }
        }
        Poll::Ready(None)
    }

    /// Records a frame of the caller's body that this attempt sends now (`keep`: the
    /// recording still keeps what it is sent), and notes the body's end.
    fn record(&mut self, frame: &Frame<B::Data>, keep: bool) {
        let recording = self.handle.recording();
        let Some(tape) = self.tape.as_mut() else {
            return;
        };
        if let Some(chunk) = frame.data_ref() {
            let len = chunk.remaining();
            tape.read += len as u64;
            // Each kept chunk costs its handle too: a body cut in tiny chunks must not hold
            // many times the limit.
            let cost = len + std::mem::size_of::<B::Data>();
            if !keep || len == 0 {
                // Nothing to keep: an empty chunk sends nothing when replayed.
            } else if tape.kept + cost <= recording.limit {
                tape.data.push(chunk.clone());
                tape.bytes += len;
                tape.kept += cost;
                // This attempt sends it now, not again from the recording.
                self.next = tape.data.len();
            } else {
                // Past the limit: no attempt will replay this, so free it now.
                tape.clear();
                tape.trailers = None;
                recording.set(Flags::OVER_LIMIT);
            }
        } else if let Some(trailers) = frame.trailers_ref() {
            if keep {
                tape.trailers = Some(Box::new(trailers.clone()));
            }
            self.trailers_sent = true;
        }
        // Trailers are the last frame: hyper stops there, without asking for the end.
        let at_end = frame.is_trailers()
            || tape
                .rest
                .as_ref()
                .is_some_and(|rest| rest_at_end(rest, tape.read, recording.declared_len));
        if at_end {
            recording.set(Flags::ENDED);
        }
    }

    pub(crate) fn is_end_stream(&self) -> bool {
        let Some(tape) = self.tape.as_ref() else {
            return true;
        };
        let rest_ended = tape.rest.as_ref().is_none_or(Body::is_end_stream);
        if rest_ended {
            // A transport told so does not ask for the end (hyper never polls an empty body):
            // the caller's body has been read to its end.
            self.handle.recording().set(Flags::ENDED);
        }
        self.next >= tape.data.len()
            && rest_ended
            && (self.trailers_sent || tape.trailers.is_none())
    }

    pub(crate) fn size_hint(&self) -> SizeHint {
        let Some(tape) = self.tape.as_ref() else {
            return SizeHint::with_exact(0);
        };
        let known = self.handle.recording().declared_len.is_some();
        crate::body_hint::with_bytes_ahead(tape.rest.as_ref(), self.replay_left, known)
    }
}

type PolledFrame<B> = Poll<Option<Result<Frame<<B as Body>::Data>, <B as Body>::Error>>>;

/// Whether the caller's body has nothing more to send after its last frame.
fn rest_at_end<B: Body>(rest: &B, read: u64, declared_len: Option<u64>) -> bool {
    rest.is_end_stream() || declared_len == Some(read)
}

impl<B: Body> Drop for Playback<B> {
    fn drop(&mut self) {
        let Some(tape) = self.tape.take() else {
            return;
        };
        let recording = self.handle.recording();
        if recording.flags().any(Flags::CLOSED) {
            // The request is over: the tape goes, not back.
            return;
        }
        let waiting = {
            let mut home = recording.home();
            home.tape = Some(tape);
            home.waiting.take()
        };
        if let Some(waker) = waiting {
            waker.wake();
        }
    }
}
