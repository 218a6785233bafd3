//! The resume of a streamed body: on a cut, the decision core decides (the budget, the
//! deadline, retries left, the request's verdict), and a `Range` request asks for the rest.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{ready, Context, Poll};

use http::{HeaderMap, Response, StatusCode};
use tokio::time::Sleep;

use super::cut::{BodyCutError, NoResume};
use super::range::Expect;
use super::BodyReport;
use crate::attempt_clock::FrameClock;
use crate::attempts::RetryReport;
use crate::attempts::{Attempts, Outcome, ResumeSlot, Step};
use crate::box_error::BoxError;
use crate::policy::StopReason;
use crate::timed_out::TimedOut;

/// A `Range` request's response, on its way.
pub(crate) type RangeFuture<B> =
    Pin<Box<dyn Future<Output = Result<Response<B>, BoxError>> + Send>>;

/// Sends the request again with these headers added (`Range`, `If-Range`, the attempt's
/// number).
pub(crate) type SendRange<B> = Box<dyn FnMut(HeaderMap) -> RangeFuture<B> + Send>;

/// What sends the request again to resume its body: a `GET` asks for the rest with `Range`; a
/// keyed write is sent again whole with its key, and its answer must be the server's stored response to
/// the same response.
pub(crate) struct Again<B> {
    pub(crate) send: SendRange<B>,
    pub(crate) keyed_write: bool,
}

enum Phase<B> {
    /// Streaming: nothing to do.
    Idle,
    /// Waiting out the backoff before the next range request.
    Waiting(Pin<Box<Sleep>>),
    /// A range request in flight, cut by the policy's clock if it runs out first. In a mutex
    /// only so the body stays `Sync` (it is only ever reached through `&mut`).
    Sending(Mutex<RangeFuture<B>>, Option<(Pin<Box<Sleep>>, TimedOut)>),
    /// No resume: the body ends with the cut's error, which says why.
    Failed(NoResume),
}

/// What a streamed body needs to resume.
pub(crate) struct Resume<B> {
    send: Mutex<SendRange<B>>,
    slot: ResumeSlot,
    attempts: Option<Attempts>,
    expect: Expect,
    status: StatusCode,
    phase: Phase<B>,
    /// The cut's error: returned, with why, when no resume is possible.
    cut: Option<BoxError>,
    /// Range requests made.
    resumes: u32,
    /// While the body streams: the policy's clock, as for an attempt, restarted by every frame
    /// (the per-attempt timeout bounds each wait for a frame; the deadline stays absolute).
    /// Set at the first wait, once the retry layer has handed over its bookkeeping.
    idle: Option<FrameClock>,
    /// Where the caller reads the report with the resumes (the response's extensions hold a
    /// clone).
    report: BodyReport,
}

impl<B> Resume<B> {
    pub(crate) fn new(
        send: SendRange<B>,
        slot: ResumeSlot,
        expect: Expect,
        status: StatusCode,
        report: BodyReport,
    ) -> Self {
        Resume {
            send: Mutex::new(send),
            slot,
            attempts: None,
            expect,
            status,
            phase: Phase::Idle,
            cut: None,
            resumes: 0,
            idle: None,
            report,
        }
    }

    /// Whether a resume is under way (the body must poll [`poll_resume`](Self::poll_resume)).
    pub(crate) fn active(&self) -> bool {
        !matches!(self.phase, Phase::Idle)
    }

    /// The body's whole length, once known (the first response's, or a `206`'s).
    pub(crate) fn total(&self) -> Option<u64> {
        self.expect.total()
    }

    /// Range requests made so far.
    pub(crate) fn resumes(&self) -> u32 {
        self.resumes
    }

    /// The report of the request's attempts, resumes included, once a cut has handed the
    /// bookkeeping to the body.
    pub(crate) fn report(&self) -> Option<RetryReport> {
        self.attempts.as_ref().map(Attempts::report_now)
    }

    /// The bookkeeping, taken from the slot the first time it is needed (the retry layer
    /// fills it when it returns the response, before the caller can poll the body).
    fn attempts(&mut self) -> Option<&mut Attempts> {
        if self.attempts.is_none() {
            self.attempts = self.slot.take_attempts();
        }
        self.attempts.as_mut()
    }

    /// While the body streams and no frame is ready: ready with the clock that ran out, if
    /// the policy has one (a per-attempt timeout, a deadline) and it did.
    pub(crate) fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<TimedOut> {
        if self.idle.is_none() {
            self.idle = self.attempts().and_then(|a| a.frame_clock());
        }
        match self.idle.as_mut() {
            Some(idle) => idle.poll(cx),
            None => Poll::Pending,
        }
    }

    /// A frame came: the wait for the next one starts now.
    pub(crate) fn on_frame(&mut self) {
        if let Some(idle) = self.idle.as_mut() {
            idle.on_frame();
        }
    }

    /// The body was cut after `received` bytes: asks the decision core whether to resume.
    pub(crate) fn begin(&mut self, err: BoxError, received: u64) {
        self.cut = Some(err);
        self.idle = None;
        self.attempts();
        let outcome = Outcome::BodyCut {
            status: self.status,
            received,
        };
        self.phase = self.decide(outcome);
    }

    fn decide(&mut self, outcome: Outcome<'_>) -> Phase<B> {
        let Some(attempts) = self.attempts.as_mut() else {
            return Phase::Failed(NoResume::Refused);
        };
        let phase = match attempts.on_outcome(outcome, Some(Ok(()))) {
            Step::Wait(after) => Phase::Waiting(Box::pin(tokio::time::sleep(after))),
            Step::Stop(reason) => {
                attempts.set_stop(reason);
                Phase::Failed(match reason {
                    StopReason::SuppressedNotIdempotent | StopReason::NoRetryMarker => {
                        NoResume::NotRepeatable
                    }
                    _ => NoResume::Refused,
                })
            }
        };
        self.publish();
        phase
    }

    /// Puts the report so far where the caller reads it.
    #[cold]
    fn publish(&self) {
        if let Some(report) = self.report() {
            self.report.set(report);
        }
    }

    /// Sends the range request for the bytes after `received`: the phase that waits for it.
    fn send_range(&mut self, received: u64) -> Phase<B> {
        let Some(attempts) = self.attempts.as_mut() else {
            return Phase::Failed(NoResume::Refused);
        };
        let mut headers = HeaderMap::new();
        self.expect.ask_from(received, &mut headers);
        attempts.next_attempt(&mut headers);
        let timer = attempts
            .sent_attempt_limit()
            .map(|(limit, why)| (Box::pin(tokio::time::sleep(limit)), why));
        let send = self.send.get_mut().unwrap_or_else(|e| e.into_inner());
        let future = send(headers);
        self.resumes += 1;
        Phase::Sending(Mutex::new(future), timer)
    }

    /// The range request's response: the rest of the body and the bytes of it already
    /// delivered when it continues the body, else the next phase is set.
    fn on_response(&mut self, res: http::Response<B>, received: u64) -> Option<(B, u64)> {
        let step = self.decide(Outcome::Response {
            status: res.status(),
            headers: res.headers(),
            extensions: res.extensions(),
        });
        // This response's own stored-response mark, as the retry policy reads it (only on
        // a request with a key).
        let stored = self
            .attempts
            .as_ref()
            .is_some_and(|a| a.is_stored_response(res.headers()));
        let checked = self
            .expect
            .check(res.status(), res.headers(), received, stored);
        match (checked, res.status().is_success()) {
            (Ok(skip), _) => {
                self.phase = Phase::Idle;
                return Some((res.into_body(), skip));
            }
            // Another representation, or the whole body again: never spliced.
            (Err(why), true) => {
                if let Some(attempts) = self.attempts.as_mut() {
                    attempts.set_stop(StopReason::Final);
                }
                self.publish();
                self.phase = Phase::Failed(why);
            }
            // An error status: as the decision core said; a final one (a 416, a 404) says
            // the body is not there any more.
            (Err(why), false) => {
                let finished = self.attempts.as_ref().map(Attempts::last_stop);
                self.phase = match step {
                    Phase::Failed(_) if finished == Some(StopReason::Final) => Phase::Failed(why),
                    step => step,
                };
            }
        }
        None
    }

    /// Drives the resume: ready with the rest of the body and how many of its bytes were
    /// already delivered, or with the error that ends the body.
    pub(crate) fn poll_resume(
        &mut self,
        cx: &mut Context<'_>,
        received: u64,
    ) -> Poll<Result<(B, u64), BodyCutError>> {
        loop {
            match &mut self.phase {
                Phase::Idle => unreachable!("polled only while a resume is under way"),
                Phase::Failed(why) => {
                    let why = *why;
                    self.phase = Phase::Idle;
                    let source = self.cut.take().unwrap_or_else(|| "body cut".into());
                    let err = BodyCutError::new(self.status, received, source)
                        .no_resume(why)
                        .with_report(self.report());
                    return Poll::Ready(Err(err));
                }
                Phase::Waiting(sleep) => {
                    ready!(sleep.as_mut().poll(cx));
                    self.phase = self.send_range(received);
                }
                Phase::Sending(future, timer) => {
                    let future = future.get_mut().unwrap_or_else(|e| e.into_inner());
                    let result = match future.as_mut().poll(cx) {
                        Poll::Ready(result) => result,
                        Poll::Pending => match timer {
                            Some((sleep, why)) => {
                                ready!(sleep.as_mut().poll(cx));
                                Err(Box::new(*why) as BoxError)
                            }
                            None => return Poll::Pending,
                        },
                    };
                    match result {
                        Ok(res) => {
                            if let Some(rest) = self.on_response(res, received) {
                                return Poll::Ready(Ok(rest));
                            }
                        }
                        Err(err) => self.phase = self.decide(Outcome::Error(&*err)),
                    }
                }
            }
        }
    }
}
