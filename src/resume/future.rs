//! The future of [`ReadWhole`](super::ReadWhole)'s calls.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::response::Parts;
use http::{Response, StatusCode};
use http_body::Body;
use pin_project_lite::pin_project;

use super::cut::{BodyCutError, NoResume};
use super::range::Expect;
use super::resumer::{Again, Resume};
use super::{BodyReport, WholeBody};
use crate::attempt_clock::{AttemptClock, FrameClock};
use crate::attempts::{BodyCut, ResumeSlot};
use crate::box_error::BoxError;
use crate::timed_out::TimedOut;

/// The most frames without data read from one body inside the attempt: a body of many empty
/// frames is handed on as a stream from there, so the reading ends. Data frames are bounded by
/// the limit's bytes (and held in few pieces: see `WholeBody::push_data`).
const MAX_FRAMES: usize = 1024;

pin_project! {
    /// The response future of [`ReadWhole`](super::ReadWhole): the attempt, then the reading
    /// of a body within the limit.
    pub struct ResponseFuture<F, B> {
        #[pin]
        state: State<F, B>,
        limit: u64,
        // What sends the request again to resume a streamed body (a GET, or a keyed write),
        // or why there is nothing.
        again: Option<Result<Again<B>, NoResume>>,
        // The attempt's clock, when it has a per-attempt timeout.
        clock: Option<AttemptClock>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B> {
        Calling { #[pin] future: F },
        // Boxed: only a response whose body is read pays for the reading's state.
        Reading { reading: Box<Reading<B>> },
        Done,
    }
}

struct Reading<B> {
    parts: Option<Parts>,
    body: Option<B>,
    whole: Option<WholeBody<B>>,
    frames: usize,
    /// The per-attempt timeout, the longest wait for one frame (the retry layer's timer keeps
    /// the deadline).
    idle: Option<FrameClock>,
    /// For a rest handed on as it streams.
    clock: Option<AttemptClock>,
}

impl<F, B> ResponseFuture<F, B> {
    /// `clock`: the attempt's, from the request's extensions.
    pub(crate) fn new(
        future: F,
        limit: u64,
        again: Result<Again<B>, NoResume>,
        clock: Option<AttemptClock>,
    ) -> Self {
        ResponseFuture {
            state: State::Calling { future },
            limit,
            again: Some(again),
            clock,
        }
    }
}

impl<F, B> std::fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Calling { .. } => "calling",
            State::Reading { .. } => "reading the body",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("limit", &self.limit)
            .finish()
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Output = Result<Response<WholeBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Calling { future } => {
                    let res = ready!(future.poll(cx))?;
                    let status = res.status();
                    // Only a body whose length the transport knows to be within the limit is
                    // read here: a stream (server-sent events) could hold the attempt forever.
                    let within = res
                        .body()
                        .size_hint()
                        .exact()
                        .is_some_and(|len| len <= *this.limit);
                    if !within {
                        let clock = this.clock.as_ref().and_then(FrameClock::of);
                        return Poll::Ready(Ok(streamed(res, this.again.take(), clock)));
                    }
                    // From here the per-attempt timeout bounds each wait for a frame, not the
                    // reading as a whole: the retry layer's timer leaves the body to us.
                    if let Some(clock) = this.clock {
                        clock.start_reading();
                    }
                    let (parts, body) = res.into_parts();
                    let reading = Box::new(Reading {
                        parts: Some(parts),
                        body: Some(body),
                        whole: Some(WholeBody::new(status, true)),
                        frames: 0,
                        idle: this
                            .clock
                            .as_ref()
                            .and_then(|c| FrameClock::new(c.frame_wait, None)),
                        clock: this.clock.take(),
                    });
                    this.state.set(State::Reading { reading });
                }
                StateProj::Reading { reading } => {
                    let res = ready!(reading.poll_read(cx));
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(res));
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}

/// A body past the limit, handed on as it streams, ready to resume with `Range` if its
/// request and its response allow it.
/// request and its response allow it; one that cannot is bounded by `clock` (the attempt's: a
/// resume has the retry layer's).
fn streamed<B>(
    res: Response<B>,
    again: Option<Result<Again<B>, NoResume>>,
    clock: Option<FrameClock>,
) -> Response<WholeBody<B>>
where
    B: Body,
{
    let (mut parts, body) = res.into_parts();
    let total = body.size_hint().exact();
    let whole = WholeBody::unread(parts.status, body);
    let status = parts.status;
    let expect = again.unwrap_or(Err(NoResume::NoSender)).and_then(|again| {
        let expect = if again.keyed_write {
            // The stored response repeats whatever status was stored.
            Expect::stored_response_of(status, &parts.headers, total)
        } else if status != StatusCode::OK {
            // Only a whole representation is resumed with `Range`.
            Err(NoResume::NotTheSame)
        } else {
            Expect::of(&parts.headers, total)
        };
        expect.map(|expect| (again.send, expect))
    });
    let whole = match expect {
        Err(why) => whole.not_resuming(why).timed(clock),
        Ok((send, expect)) => {
            let slot = ResumeSlot::default();
            parts.extensions.insert(slot.clone());
            let report = BodyReport::default();
            parts.extensions.insert(report.clone());
            whole.resuming(Resume::new(send, slot, expect, status, report))
        }
    };
    Response::from_parts(parts, whole)
}

impl<B> Reading<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    /// Reads the body to its end, its first error, a wait for a frame longer than the
    /// per-attempt timeout (a stall: a cut), or `MAX_FRAMES` frames without data. A body that
    /// keeps coming is not cut, however long it takes.
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<Response<WholeBody<B>>> {
        while self.frames < MAX_FRAMES {
            let body = self.body.as_mut().expect("read once");
            let polled = match Pin::new(&mut *body).poll_frame(cx) {
                Poll::Ready(polled) => polled,
                Poll::Pending => {
                    ready!(self.poll_stall(cx));
                    return Poll::Ready(self.cut(Box::new(TimedOut::Attempt)));
                }
            };
            if let Some(idle) = self.idle.as_mut() {
                idle.on_frame();
            }
            let whole = self.whole.as_mut().expect("read once");
            match polled {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(chunk) if chunk.is_empty() => self.frames += 1,
                    Ok(chunk) => whole.push_data(chunk),
                    Err(frame) => {
                        if let Ok(trailers) = frame.into_trailers() {
                            whole.set_trailers(trailers);
                        }
                    }
                },
                Some(Err(err)) => return Poll::Ready(self.cut(err.into())),
                None => return Poll::Ready(self.finish(false)),
            }
        }
        // Too many frames for a body worth holding: the rest streams.
        Poll::Ready(self.finish(true))
    }

    /// Ready when the wait for the next frame has outlasted the per-attempt timeout.
    fn poll_stall(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match self.idle.as_mut() {
            Some(idle) => idle.poll(cx).map(drop),
            None => Poll::Pending,
        }
    }

    /// The body was cut (an error, or a stall): the attempt failed after the server answered.
    #[cold]
    fn cut(&mut self, err: BoxError) -> Response<WholeBody<B>> {
        let mut parts = self.parts.take().expect("read once");
        let whole = self.whole.take().expect("read once");
        let received = whole.received();
        let cut = BodyCutError::new(parts.status, received, err);
        parts.extensions.insert(BodyCut { received });
        Response::from_parts(parts, whole.then_fail(cut))
    }

    fn finish(&mut self, stream_rest: bool) -> Response<WholeBody<B>> {
        let parts = self.parts.take().expect("read once");
        let mut whole = self.whole.take().expect("read once");
        if let Some(rest) = self.body.take().filter(|_| stream_rest) {
            // Too many empty frames: the rest streams, bounded as a streamed body is.
            let clock = self.clock.as_ref().and_then(FrameClock::of);
            whole = whole.then(rest).timed(clock);
        }
        Response::from_parts(parts, whole)
    }
}
