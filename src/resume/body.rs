use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body::{Body, Frame, SizeHint};

use super::cut::{BodyCutError, NoResume};
use super::resumer::Resume;
use crate::attempt_clock::FrameClock;
use crate::attempts::RetryReport;
use crate::box_error::BoxError;

/// A response body behind [`ReadWholeLayer`](crate::resume::ReadWholeLayer): read whole inside the
/// attempt (then sent from memory), or streamed as it comes when it is longer than the limit,
/// and then resumed with `Range` where a cut allows it. A cut that was not recovered ends it
/// with a [`BodyCutError`]; the transport's error is its source.
pub struct WholeBody<B> {
    /// What was read inside the attempt, sent first.
    read: VecDeque<Bytes>,
    /// Bytes in `read`.
    read_len: u64,
    trailers: Option<HeaderMap>,
    /// The rest of the body, streamed as it comes.
    rest: Option<B>,
    /// The error that ends the body, after what was read.
    error: Option<BodyCutError>,
    /// Whether the body's length was known from the start.
    exact: bool,
    /// For a streamed rest: the response's status and the bytes received so far, to say where
    /// a cut happened.
    status: StatusCode,
    received: u64,
    /// How a streamed body resumes after a cut, if it can.
    resume: Option<Box<Resume<B>>>,
    /// Why a streamed body cannot resume, when that is known from the start.
    no_resume: Option<NoResume>,
    /// Bytes of the rest that were delivered already (a range answered with a superset).
    skip: u64,
    /// For a streamed rest that cannot resume: the attempt's clock, which cuts a wait for a
    /// frame longer than the per-attempt timeout, and the body at the deadline (a resume
    /// keeps the retry layer's clock instead).
    clock: Option<FrameClock>,
}

impl<B> WholeBody<B> {
    pub(crate) fn new(status: StatusCode, exact: bool) -> Self {
        WholeBody {
            read: VecDeque::new(),
            read_len: 0,
            trailers: None,
            rest: None,
            error: None,
            exact,
            status,
            received: 0,
            resume: None,
            no_resume: None,
            skip: 0,
            clock: None,
        }
    }

    pub(crate) fn timed(mut self, clock: Option<FrameClock>) -> Self {
        self.clock = clock;
        self
    }

    pub(crate) fn resuming(mut self, resume: Resume<B>) -> Self {
        self.resume = Some(Box::new(resume));
        self
    }

    pub(crate) fn not_resuming(mut self, why: NoResume) -> Self {
        self.no_resume = Some(why);
        self
    }

    /// How many times the rest of the body was asked for with `Range`.
    ///
    /// ```
    /// # fn show(body: &tower_retry_safety::resume::WholeBody<hyper::body::Incoming>) {
    /// println!("resumed {} time(s)", body.resumes());
    /// # }
    /// ```
    pub fn resumes(&self) -> u32 {
        self.resume.as_ref().map_or(0, |r| r.resumes())
    }

    /// The report of the request's attempts with the resumes of this body, once a cut has
    /// handed the retry layer's bookkeeping to it; `None` before (the response's
    /// [`RetryReport`] is then the whole story). Its
    /// [`body_cut_after`](crate::attempts::AttemptOutcome::body_cut_after) records say how many bytes had
    /// been delivered at each cut, and its stop reason why the resumes stopped.
    ///
    /// ```
    /// # fn show(body: &tower_retry_safety::resume::WholeBody<hyper::body::Incoming>) {
    /// if let Some(report) = body.report() {
    ///     println!("{} attempt(s), stopped: {:?}", report.attempts(), report.stop_reason());
    /// }
    /// # }
    /// ```
    pub fn report(&self) -> Option<RetryReport> {
        self.resume.as_ref().and_then(|r| r.report())
    }

    /// A body handed on unread: the original, streamed as it is.
    pub(crate) fn unread(status: StatusCode, body: B) -> Self {
        WholeBody::new(status, true).then(body)
    }

    pub(crate) fn push_data(&mut self, chunk: Bytes) {
        /// Pieces held before they are joined into one: a body within the limit sent in tiny
        /// frames (one byte each, say) would otherwise cost a `Bytes` per byte.
        const JOIN_AT: usize = 1024;
        self.read_len += chunk.len() as u64;
        self.received += chunk.len() as u64;
        self.read.push_back(chunk);
        if self.read.len() >= JOIN_AT {
            let mut joined = bytes::BytesMut::with_capacity(self.read_len as usize);
            for piece in self.read.drain(..) {
                joined.extend_from_slice(&piece);
            }
            self.read.push_back(joined.freeze());
        }
    }

    pub(crate) fn set_trailers(&mut self, trailers: HeaderMap) {
        self.trailers = Some(trailers);
    }

    pub(crate) fn then(mut self, rest: B) -> Self {
        self.rest = Some(rest);
        self
    }

    pub(crate) fn then_fail(mut self, error: BodyCutError) -> Self {
        self.error = Some(error);
        self
    }

    /// Bytes received from the server so far (read inside the attempt, then streamed).
    pub(crate) fn received(&self) -> u64 {
        self.received
    }
}

impl<B> Body for WholeBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(chunk) = this.read.pop_front() {
            this.read_len -= chunk.len() as u64;
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if let Some(err) = this.error.take() {
            return Poll::Ready(Some(Err(Box::new(err))));
        }
        loop {
            if let Some(resume) = this.resume.as_mut().filter(|r| r.active()) {
                match ready!(resume.poll_resume(cx, this.received)) {
                    Ok((rest, skip)) => {
                        this.rest = Some(rest);
                        this.skip = skip;
                    }
                    Err(cut) => {
                        this.rest = None;
                        return Poll::Ready(Some(Err(Box::new(cut))));
                    }
                }
            }
            let Some(rest) = this.rest.as_mut() else {
                break;
            };
            let step = match Pin::new(rest).poll_frame(cx) {
                Poll::Pending => this.on_pending(cx),
                Poll::Ready(Some(Ok(frame))) => this.on_frame(frame),
                Poll::Ready(Some(Err(err))) => this.on_error(err.into()),
                Poll::Ready(None) => this.on_end(),
            };
            match step {
                Step::Again => continue,
                Step::Give(polled) => return polled,
            }
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_empty()
            && self.error.is_none()
            && self.trailers.is_none()
            && self.rest.as_ref().is_none_or(Body::is_end_stream)
            && !self.resume.as_ref().is_some_and(|r| r.active())
    }

    fn size_hint(&self) -> SizeHint {
        crate::body_hint::with_bytes_ahead(self.rest.as_ref(), self.read_len, self.exact)
    }
}

/// What `poll_frame` does after one poll of the rest of the body.
enum Step {
    /// Poll again: a resume began, or a frame held only bytes already delivered.
    Again,
    /// Give this to the reader.
    Give(Poll<Option<Result<Frame<Bytes>, BoxError>>>),
}

impl<B> WholeBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    /// The body stopped here for `why`, and is not resumed: the error the reader gets.
    fn cut(&mut self, why: BoxError) -> Step {
        self.rest = None;
        let mut cut = BodyCutError::new(self.status, self.received, why);
        if let Some(why) = self.no_resume {
            cut = cut.no_resume(why);
        }
        Step::Give(Poll::Ready(Some(Err(Box::new(cut)))))
    }

    /// The rest is pending: a body that stalls past the policy's clock is cut like one that
    /// ends (and resumed, when it may be).
    fn on_pending(&mut self, cx: &mut Context<'_>) -> Step {
        let stalled = match (self.resume.as_mut(), self.clock.as_mut()) {
            (Some(resume), _) => resume.poll_idle(cx),
            (None, Some(clock)) => match clock.poll(cx) {
                Poll::Ready(why) => return self.cut(Box::new(why)),
                Poll::Pending => Poll::Pending,
            },
            (None, None) => Poll::Pending,
        };
        match (stalled, self.resume.as_mut()) {
            (Poll::Ready(why), Some(resume)) => {
                self.rest = None;
                resume.begin(Box::new(why), self.received);
                Step::Again
            }
            _ => Step::Give(Poll::Pending),
        }
    }

    /// A frame of the rest: data past what was delivered goes on, trailers as they are.
    fn on_frame(&mut self, frame: Frame<Bytes>) -> Step {
        if let Some(resume) = self.resume.as_mut() {
            resume.on_frame();
        }
        if let Some(clock) = self.clock.as_mut() {
            clock.on_frame();
        }
        let mut data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => return Step::Give(Poll::Ready(Some(Ok(frame)))),
        };
        // What a superset repeats was delivered already.
        if self.skip > 0 {
            let skip = self.skip.min(data.len() as u64);
            self.skip -= skip;
            data = data.slice(skip as usize..);
            if data.is_empty() {
                return Step::Again;
            }
        }
        let total = self.resume.as_ref().and_then(|r| r.total());
        if total.is_some_and(|t| self.received + data.len() as u64 > t) {
            // More than the body's length: not the body that was asked for. Nothing of it
            // goes on.
            self.rest = None;
            let cut = BodyCutError::new(
                self.status,
                self.received,
                "the server sent more bytes than the body's length".into(),
            )
            .no_resume(NoResume::NotTheSame);
            return Step::Give(Poll::Ready(Some(Err(Box::new(cut)))));
        }
        self.received += data.len() as u64;
        Step::Give(Poll::Ready(Some(Ok(Frame::data(data)))))
    }

    /// The rest failed: nothing more comes from it; resumed when it may be.
    fn on_error(&mut self, err: BoxError) -> Step {
        match self.resume.as_mut() {
            Some(resume) => {
                self.rest = None;
                resume.begin(err, self.received);
                Step::Again
            }
            None => self.cut(err),
        }
    }

    /// The rest ended: a clean end before the body's length is a cut too (a `206` shorter
    /// than its `Content-Range`).
    fn on_end(&mut self) -> Step {
        self.rest = None;
        if let Some(resume) = self.resume.as_mut() {
            if resume.total().is_some_and(|t| self.received < t) {
                resume.begin("the body ended before its length".into(), self.received);
                return Step::Again;
            }
        }
        Step::Give(Poll::Ready(None))
    }
}

// Nothing in it is pinned: the original body is polled pinned only when it is `Unpin`.
impl<B> Unpin for WholeBody<B> {}

/// Says how much was read; never the content.
impl<B> fmt::Debug for WholeBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WholeBody")
            .field("status", &self.status)
            .field("received", &self.received)
            .field("read_bytes", &self.read_len)
            .field("streaming", &self.rest.is_some())
            .field("cut", &self.error.is_some())
            .field("resumes", &self.resumes())
            .finish_non_exhaustive()
    }
}
