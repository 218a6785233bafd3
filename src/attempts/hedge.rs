//! Hedging's steps in the decision core: whether a request may be hedged and after how long,
//! whether the next hedge may go now, what an attempt's outcome means while others are in
//! flight, and the attempts that lost. The front ends only send, poll and drop.

use std::time::Duration;

use tokio::time::Instant;

use super::{AttemptOutcome, BodyCut, HedgeSummary};
use super::{Attempts, Outcome, Step};
use crate::classify::{classify_error_with, BodyVerdict, Classification, FailureClass};
use crate::policy::StopReason;

/// A hedge-able request's bookkeeping.
pub(crate) struct HedgeRun {
    /// Its host's latency slot.
    slot: usize,
    /// When each attempt was sent, in the order sent.
    starts: Vec<Instant>,
    /// The next send is a hedge (for its span).
    next_is_hedge: bool,
    /// No more hedges: an attempt was told to wait (a keyed write's 409: the first attempt
    /// still runs on the server; a `Retry-After`), and another send would only be told the
    /// same, or go before the server's wait.
    held: bool,
    /// The number of the attempt whose outcome is being decided (for its event and log).
    pub(super) deciding: Option<u32>,
    summary: HedgeSummary,
}

impl HedgeRun {
    /// Marks an attempt sent; its number, from 1, and whether it is a hedge.
    pub(super) fn sent(&mut self) -> (u32, bool) {
        self.starts.push(Instant::now());
        let hedge = std::mem::take(&mut self.next_is_hedge);
        (self.starts.len() as u32, hedge)
    }

    pub(super) fn summary(&self) -> HedgeSummary {
        self.summary
    }
}

/// What a front end does after an attempt's outcome while hedging.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HedgeStep {
    /// This outcome is the request's: drop the others (after [`Attempts::supersede`]) and
    /// [`finish`](Attempts::finish) with it.
    Stop(StopReason),
    /// Keep waiting for the attempts in flight; with `resend_now`, send another attempt as
    /// soon as the service is ready, if [`Attempts::may_resend_now`] then allows it.
    KeepWaiting { resend_now: bool },
    /// Nothing is in flight: wait this long, then send again.
    Wait(Duration),
}

impl Attempts {
    /// Whether this request may be hedged, and the delay before its first hedge. Call once,
    /// before the first attempt, and only when the policy hedges. `host` is called only for a
    /// request that may be hedged; `copyable`: the front end kept a copy of the body (a
    /// recording cannot feed two attempts at once).
    ///
    /// A request that may be hedged deposits in the hedge budget, and its latencies are
    /// counted even while its host has too few of them for a hedge (`None`).
    pub(crate) fn plan_hedge<'h>(
        &mut self,
        host: impl FnOnce() -> Option<(&'h str, Option<u16>)>,
        copyable: bool,
    ) -> Option<Duration> {
        let hedger = self.policy.hedging()?;
        // Never twice: `may_hedge` is false for a write a repeat could harm.
        if self.outer_layer
            || self.max_retries == 0
            || self.not_replayable.is_some()
            || !hedger.may_hedge(&self.verdict)
        {
            return None;
        }
        hedger.tokens().deposit();
        let slot = hedger.slot(host);
        self.hedge = Some(Box::new(HedgeRun {
            slot,
            starts: Vec::with_capacity(2),
            next_is_hedge: false,
            held: false,
            deciding: None,
            summary: HedgeSummary::default(),
        }));
        if !copyable {
            return None;
        }
        hedger.delay(slot)
    }

    /// Whether a hedge may be sent now, the attempts in flight being slow: hedges left, sends
    /// left within `max_retries`, time before the deadline, a hedge token and the retry
    /// budget (both spent, and the hedge counted, when it answers true). Ask only when the
    /// hedge is handed to the inner service at once: a hedge that waits for the service and
    /// is never sent would be counted, and its token and budget spent, for nothing.
    pub(crate) fn may_hedge(&mut self) -> bool {
        if !self.hedges_left() || self.time_left() == Some(Duration::ZERO) {
            return false;
        }
        let (Some(hedger), Some(run)) = (self.policy.hedging(), self.hedge.as_mut()) else {
            return false;
        };
        if run.held {
            return false;
        }
        if !hedger.tokens().withdraw() {
            return false;
        }
        if !self.policy.withdraw() {
            hedger.tokens().refund();
            return false;
        }
        run.summary.hedges += 1;
        run.next_is_hedge = true;
        true
    }

    /// Whether the resend that [`HedgeStep::KeepWaiting`] asked for may go now, the retry
    /// budget permitting (spent when it answers true): ask only when it is handed to the
    /// inner service at once, as for [`may_hedge`](Self::may_hedge).
    pub(crate) fn may_resend_now(&self) -> bool {
        !self.past_deadline() && self.policy.withdraw()
    }

    /// How many attempts were sent so far (the number of the last one).
    pub(crate) fn sent(&self) -> u32 {
        self.hedge
            .as_ref()
            .map_or(self.outcomes.len(), |r| r.starts.len() as u32)
    }

    /// Whether the delay allows another hedge after this one (for re-arming the timer).
    pub(crate) fn hedges_left(&self) -> bool {
        match (self.policy.hedging(), &self.hedge) {
            (Some(hedger), Some(run)) => {
                run.summary.hedges < hedger.max_hedges()
                    && (run.starts.len() as u32) <= self.max_retries
            }
            _ => false,
        }
    }

    /// Decides after attempt `number`'s outcome while hedging; `others_in_flight` says whether
    /// other attempts are still running. The first success wins; a final outcome ends all; a
    /// failure that could be retried waits for the others and sends the next attempt at once
    /// if the retry budget allows. Without others, the ordinary decision.
    pub(crate) fn on_hedged_outcome(
        &mut self,
        number: u32,
        outcome: Outcome<'_>,
        others_in_flight: bool,
    ) -> HedgeStep {
        self.record_latency(Some(number), &outcome);
        if let Some(run) = self.hedge.as_mut() {
            run.deciding = Some(number);
        }
        let responded = matches!(outcome, Outcome::Response { .. });
        if !others_in_flight {
            return match self.decide_outcome(outcome, Some(Ok(()))) {
                Step::Wait(after) => HedgeStep::Wait(after),
                Step::Stop(reason) => self.won(number, responded, reason),
            };
        }
        let (classification, status) = self.classify_outcome(outcome);
        if classification.class() == FailureClass::Final || classification.is_stored_response() {
            // Recorded, logged and reported as any last attempt is.
            let reason = match self.decide(classification, status) {
                crate::policy::Decision::Stop(reason) => reason,
                // A final outcome is never retried; stop anyway if it ever were.
                _ => StopReason::Final,
            };
            return self.won(number, responded, reason);
        }
        // Not fatal: a request that may be hedged may be repeated after any other outcome.
        // Not decided by the retry table, so no attempt event: the report and the span say it.
        if let Some(run) = self.hedge.as_mut() {
            run.deciding = None;
        }
        self.record_span(&classification, status, "keep-waiting");
        tracing::debug!(
            http.request.method = %self.target.method,
            url.path = self.target.path(),
            attempt = number,
            error.r#type = classification.class().as_str(),
            http.response.status_code = status.map(|s| s.as_u16()),
            "hedged attempt failed; waiting for the attempts still in flight"
        );
        self.outcomes.push(AttemptOutcome {
            class: classification.class(),
            status,
            delay: None,
            body_cut: None,
        });
        let sends = self.hedge.as_ref().map_or(0, |r| r.starts.len() as u32);
        // A 409 to a keyed write says the first attempt is still running on the server:
        // another send would get the same, so wait for the first one's answer.
        // Nor at once when the server asked for a wait (Retry-After): the others may answer
        // meanwhile, and if none does, the ordinary decision honours the wait. No more hedges
        // either, for the same reasons.
        let hold =
            status == Some(http::StatusCode::CONFLICT) || classification.retry_after().is_some();
        if let (true, Some(run)) = (hold, self.hedge.as_mut()) {
            run.held = true;
        }
        let resend_now = !hold && sends <= self.max_retries && !self.past_deadline();
        HedgeStep::KeepWaiting { resend_now }
    }

    fn won(&mut self, number: u32, responded: bool, reason: StopReason) -> HedgeStep {
        if let Some(run) = self.hedge.as_mut() {
            // Only when a hedge was sent: a plain retry that answers wins nothing.
            if responded && run.summary.hedges > 0 {
                run.summary.won_by = Some(number);
                super::won(self.span());
            }
        }
        HedgeStep::Stop(reason)
    }

    /// The attempts still in flight when another's outcome ended the request: their time so
    /// far is counted as a lower bound of their latency, and they are reported as superseded.
    pub(crate) fn supersede(&mut self, numbers: impl Iterator<Item = u32>) {
        let (Some(hedger), Some(run)) = (self.policy.hedging(), self.hedge.as_mut()) else {
            return;
        };
        for number in numbers {
            if let Some(start) = run.starts.get(number as usize - 1) {
                hedger.add_sample(run.slot, start.elapsed());
            }
            run.summary.superseded += 1;
        }
    }

    /// Counts attempt `number`'s latency (`None`: the last sent) if it says something about
    /// the host's tail: a response but 429 and 5xx, or an attempt cut by a timeout (its time
    /// so far, a lower bound). Fast failures are left out.
    pub(super) fn record_latency(&self, number: Option<u32>, outcome: &Outcome<'_>) {
        let (Some(hedger), Some(run)) = (self.policy.hedging(), self.hedge.as_ref()) else {
            return;
        };
        let counts = match outcome {
            Outcome::Response { status, .. } => {
                !status.is_server_error() && *status != http::StatusCode::TOO_MANY_REQUESTS
            }
            Outcome::Error(err) => is_timeout(*err),
            Outcome::BodyCut { .. } => false,
        };
        let index = number.map_or(run.starts.len(), |n| n as usize);
        if let (true, Some(start)) = (counts, run.starts.get(index.wrapping_sub(1))) {
            hedger.add_sample(run.slot, start.elapsed());
        }
    }

    /// The outcome's classification, and its status.
    fn classify_outcome(
        &mut self,
        outcome: Outcome<'_>,
    ) -> (Classification, Option<http::StatusCode>) {
        match outcome {
            Outcome::Response {
                status,
                headers,
                extensions,
            } => {
                // A success whose body a reading layer inside found cut is ambiguous, as
                // `on_body_cut` has it.
                if status.is_success() && extensions.get::<BodyCut>().is_some() {
                    return (FailureClass::Ambiguous.into(), Some(status));
                }
                let body_verdict = extensions.get::<BodyVerdict>().map(|v| v.0);
                let c = self.policy.classify_status(
                    &self.verdict,
                    status,
                    headers,
                    body_verdict,
                    self.is_grpc(),
                );
                (c, Some(status))
            }
            Outcome::Error(err) => (classify_error_with(err, self.stack).into(), None),
            // A resume's cut, decided after the response went to the caller: not hedged.
            Outcome::BodyCut { status, .. } => (FailureClass::Ambiguous.into(), Some(status)),
        }
    }
}

/// Whether an attempt's error is a timeout's: the policy's own clock, or tower's `Timeout`.
fn is_timeout(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(e) = next {
        if e.is::<crate::timed_out::TimedOut>() || e.is::<tower::timeout::error::Elapsed>() {
            return true;
        }
        next = e.source();
    }
    false
}
