//! What the decision core does for a response body cut mid-way: the cut as an attempt's
//! outcome, and the continuation that decides the body's resumes after the caller got the head.

use std::sync::{Arc, Mutex};

use http::{Extensions, HeaderMap, StatusCode};

use super::Attempts;
use super::RetryReport;
use crate::attempt_clock::{AttemptClock, FrameClock};
use crate::classify::{BodyVerdict, Classification, FailureClass};
use crate::policy::{Decision, StopReason};

impl Attempts {
    /// The marks a body classifier or a body-reading front end left on the response: used up
    /// here, by the layer that decided on them (an outer retry layer must not take them for its
    /// own). A body that streams on may be resumed: its resumes are decided by a continuation
    /// of `self`.
    #[cold]
    pub(super) fn take_body_marks(&self, extensions: &mut Extensions, reason: StopReason) {
        BodyVerdict::take(extensions);
        BodyCut::take(extensions);
        if let Some(slot) = ResumeSlot::take(extensions) {
            slot.fill(self.continuation(reason));
        }
    }

    /// The server answered `status`, then the body was cut after `received` bytes, while it
    /// was read inside the attempt. A success whose body was cut is ambiguous, whatever it
    /// says: the attempt reached the server's application, so the table sends again only a
    /// request whose repeat is harmless (a keyed write with the same key, which a server that
    /// honours keys sends its stored response), and a write is never sent twice. Any other status is classified
    /// as it would be whole (the server's hint, `Retry-After`, a final status): a cut body
    /// does not make a response worth asking for again.
    #[cold]
    pub(super) fn on_body_cut(
        &mut self,
        status: StatusCode,
        headers: &HeaderMap,
        received: u64,
    ) -> Decision {
        let outcome = if status.is_success() {
            Classification::with_retry_after(FailureClass::Ambiguous, None)
        } else {
            self.policy
                .classify_status(&self.verdict, status, headers, None, false)
        };
        self.decide_cut(outcome, Some(status), Some(received))
    }

    /// The bookkeeping for resuming the response's body after `finish` (the caller has the
    /// head): the same request, its attempts so far, and its deadline. Nothing is deposited in
    /// the budget again.
    #[cold]
    fn continuation(&self, stop: StopReason) -> Attempts {
        Attempts {
            policy: self.policy.clone(),
            verdict: self.verdict,
            target: self.target.clone(),
            not_replayable: self.not_replayable,
            outer_layer: self.outer_layer,
            max_retries: self.max_retries,
            attempt_timeout: self.attempt_timeout,
            deadline_at: self.deadline_at,
            first_attempt_at: self.first_attempt_at,
            last_attempt_at: self.last_attempt_at,
            outcomes: self.outcomes.clone(),
            request_id: self.request_id.clone(),
            idempotency_key: self.idempotency_key.clone(),
            last_stop: stop,
            grpc: self.grpc,
            caller_deadline: self.caller_deadline,
            never_sent: self.never_sent,
            sends_deadline: self.sends_deadline,
            wired_limit: None,
            stack: self.stack,
            hedge: None,
            span: None,
        }
    }

    /// The report so far, `self` left as it is: for a body that resumes after the caller got
    /// the head.
    pub(crate) fn report_now(&self) -> RetryReport {
        RetryReport {
            verdict: self.verdict,
            outcomes: self.outcomes.clone(),
            stop: self.last_stop,
            first_attempt_at: self.first_attempt_at,
            last_attempt_at: self.last_attempt_at,
            request_id: self.request_id.clone(),
            idempotency_key: self.idempotency_key.clone(),
            body: None,
            hedging: Default::default(),
        }
    }

    /// The clock of the attempt about to be sent, for a front end that reads its body: the
    /// per-attempt timeout, the deadline, and whether a failure of this attempt could be
    /// followed by another.
    pub(crate) fn clock(&self) -> AttemptClock {
        let may_repeat = !self.outer_layer
            && self.not_replayable.is_none()
            && self.verdict.repeat_is_harmless()
            && self.outcomes.len() < self.max_retries;
        AttemptClock::new(self.attempt_timeout, self.deadline_at(), may_repeat)
    }

    /// The clock of a body streaming to the caller after the head: each wait for a frame
    /// bounded by the per-attempt timeout, the whole by the deadline (`None`: neither).
    pub(crate) fn frame_clock(&self) -> Option<FrameClock> {
        FrameClock::new(self.attempt_timeout, self.deadline_at())
    }

    /// Whether the server marked `headers`' response its stored response to this
    /// request's key.
    pub(crate) fn is_stored_response(&self, headers: &HeaderMap) -> bool {
        self.policy.is_stored_response(&self.verdict, headers)
    }

    /// Why the last decision stopped.
    pub(crate) fn last_stop(&self) -> StopReason {
        self.last_stop
    }

    /// Keeps why the resumes stopped, for [`report_now`](Self::report_now).
    pub(crate) fn set_stop(&mut self, stop: StopReason) {
        self.last_stop = stop;
    }
}

/// A response whose body was cut while it was read inside the attempt, carried to the retry
/// layer in the response's extensions: the attempt failed after the server answered. Put there
/// by [`ReadWholeLayer`](crate::resume::ReadWholeLayer); used up by the layer that decides on it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BodyCut {
    /// Bytes of the body received before the cut.
    pub(crate) received: u64,
}

impl BodyCut {
    pub(crate) fn take(extensions: &mut Extensions) -> Option<BodyCut> {
        extensions.remove::<BodyCut>()
    }
}

/// Where the retry layer hands its bookkeeping over to a body that may resume, once it returns
/// the response (put in the response's extensions by the front end that reads bodies, taken
/// out by [`Attempts::finish`]). Without a retry layer outside, it stays empty: nothing decides
/// a resume, so none is made.
#[derive(Clone, Default)]
pub(crate) struct ResumeSlot(Arc<Mutex<Option<Attempts>>>);

impl ResumeSlot {
    pub(crate) fn take(extensions: &mut Extensions) -> Option<ResumeSlot> {
        extensions.remove::<ResumeSlot>()
    }

    pub(crate) fn fill(&self, attempts: Attempts) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(attempts);
    }

    pub(crate) fn take_attempts(&self) -> Option<Attempts> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}
