//! Per-request bookkeeping shared by the tower layer and the reqwest adapter: classify each
//! attempt's outcome, record it, ask the policy, log, and build the report or the error. Both
//! front ends drive this one type, so the decision has one code path.

mod body_cut;
mod deadline;
mod ending;
mod error;
mod hedge;
mod log;
mod markers;
mod plan;
mod refusal;
mod report;
mod span;

pub(crate) use body_cut::{BodyCut, ResumeSlot};
pub use error::{Error, MayHaveBeenApplied};
pub(crate) use hedge::HedgeStep;
pub use markers::attempt_number;
pub(crate) use markers::{AttemptNumber, KeyHeader, LayerAttempt};
pub(crate) use plan::Plan;
use plan::{printable, MAX_REQUEST_ID_LEN};
pub use refusal::NotReplayable;
pub use report::{AttemptOutcome, RetryReport};
pub(crate) use report::{HedgeSummary, Outcomes};
pub(crate) use span::{superseded, won};

use std::error::Error as StdError;
use std::time::{Duration, SystemTime};

use http::{Extensions, HeaderMap, HeaderValue, StatusCode};
use tokio::time::Instant;

use crate::box_error::BoxError;
use crate::classify::{
    classify_error_with, BodyVerdict, Classification, RequestVerdict, StackErrors,
};
use crate::policy::{AttemptEvent, Decision, Facts, RetryPolicy, StopReason};
use crate::target::Target;
use crate::timed_out::TimedOut;

/// Longest wait, after the backoff, for the last attempt's transport to let go of a recorded
/// body. hyper drops a body as it reports the attempt's failure, so this is a bound for inner
/// services that keep a request after failing it, not a wait in the common case.
pub(crate) const LET_GO_WAIT: Duration = Duration::from_secs(1);

/// The error of a request whose next attempt was not sent: the deadline passed first.
const DEADLINE_BEFORE_SEND: &str =
    "the request's deadline passed before its next attempt could be sent";

/// What a front end does after an attempt, as [`Attempts::on_outcome`] decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Wait this long, then send the request again: with a recorded body, first wait up to
    /// [`Attempts::body_wait`] for the last attempt's transport to let go of it.
    Wait(Duration),
    /// Stop, and return the outcome through [`Attempts::finish`].
    Stop(StopReason),
}

/// How an attempt ended, as the decision reads it.
#[derive(Clone, Copy)]
pub(crate) enum Outcome<'a> {
    /// A response; `extensions` are the response's (a body classifier inside the layer
    /// leaves its verdict there).
    Response {
        status: StatusCode,
        headers: &'a HeaderMap,
        extensions: &'a Extensions,
    },
    /// An error: the transport's, a layer's, or the policy's clock cutting the attempt.
    Error(&'a (dyn StdError + 'static)),
    /// The server answered `status`, then the response body was cut after `received` bytes.
    BodyCut { status: StatusCode, received: u64 },
}

impl<'a> Outcome<'a> {
    /// The outcome of an attempt through a tower service.
    #[inline]
    pub(crate) fn of<B>(result: &'a Result<http::Response<B>, BoxError>) -> Self {
        match result {
            Ok(res) => Outcome::Response {
                status: res.status(),
                headers: res.headers(),
                extensions: res.extensions(),
            },
            Err(err) => Outcome::Error(&**err),
        }
    }
}

/// A front end's successful outcome: a response, which carries the report in its extensions.
pub(crate) trait CarriesReport {
    fn extensions_mut(&mut self) -> &mut Extensions;
    /// A gRPC status drops the extensions: the report's gist goes in its metadata.
    fn headers_mut(&mut self) -> &mut HeaderMap;
}

impl<B> CarriesReport for http::Response<B> {
    #[inline]
    fn extensions_mut(&mut self) -> &mut Extensions {
        http::Response::extensions_mut(self)
    }

    fn headers_mut(&mut self) -> &mut HeaderMap {
        http::Response::headers_mut(self)
    }
}

pub(crate) struct Attempts {
    policy: RetryPolicy,
    verdict: RequestVerdict,
    target: Target,
    /// Why the request's body cannot be sent again, if it cannot (no copy in hand, or a
    /// recording that stopped being replayable).
    not_replayable: Option<NotReplayable>,
    /// An outer layer of this crate made this attempt and decides about retries.
    outer_layer: bool,
    /// Retries allowed: the request's option or the policy's.
    max_retries: u32,
    /// The request's deadline and per-attempt timeout: its options or the policy's. Only the
    /// outermost layer keeps them; an inner one leaves the time to it.
    attempt_timeout: Option<Duration>,
    /// When the deadline passes: the clock is read at the first attempt only when there is
    /// one. A deadline too far to be a time has none.
    deadline_at: Option<Instant>,
    first_attempt_at: SystemTime,
    last_attempt_at: SystemTime,
    outcomes: Outcomes,
    request_id: Option<Box<str>>,
    idempotency_key: Option<Box<str>>,
    /// Why the last decision stopped (kept only for a body that resumes after `finish`).
    last_stop: StopReason,
    /// A gRPC call: each attempt carries the time left and the attempts before it.
    grpc: bool,
    /// The deadline is the caller's (inherited from the inbound request, less the margin),
    /// not this request's own: a stop on it is [`StopReason::CallerDeadline`].
    caller_deadline: bool,
    /// Not even the first attempt was sent: the caller's deadline had passed.
    never_sent: bool,
    /// Each attempt carries the time left and its number (an HTTP host that asked).
    sends_deadline: Option<crate::deadline::Convention>,
    /// The limit the attempt about to be sent carries on the wire, kept for its timer: the
    /// wire never says more than the timer waits, and the clock is read once.
    wired_limit: Option<(Duration, TimedOut)>,
    /// What the client stack's own errors say (the front end's hook).
    stack: &'static StackErrors,
    /// Hedging's bookkeeping, for a request the policy may hedge (boxed: a request that is
    /// not hedged pays one word).
    hedge: Option<Box<hedge::HedgeRun>>,
    /// The current attempt's span, if a subscriber wants it.
    span: Option<Box<tracing::Span>>,
}

impl Attempts {
    /// Starts the bookkeeping for one request and deposits it in the retry budget (unless an
    /// outer layer already did). `kept` says whether the front end kept what it needs to
    /// send the body again, or why not.
    pub(crate) fn start(
        policy: &RetryPolicy,
        plan: Plan,
        target: Target,
        kept: Result<(), NotReplayable>,
    ) -> Self {
        // Without a copy, retries are refused as "body not replayable" — unless the request
        // could never be retried anyway, in which case the decision names the real reason.
        let not_replayable = if plan.may_retry(policy) {
            kept.err()
        } else {
            None
        };
        let max_retries = deadline::retries_for(policy, &plan);
        let (grpc, stack) = (plan.grpc, plan.stack);
        let (inbound, sends_deadline) = (plan.inbound, plan.sends_deadline);
        let Plan {
            verdict,
            outer_layer,
            key: idempotency_key,
            request_id,
            options,
            ..
        } = plan;
        let (deadline, attempt_timeout) = if outer_layer {
            (None, None)
        } else {
            (
                options.and_then(|o| o.deadline).or(policy.timeouts().0),
                options
                    .and_then(|o| o.attempt_timeout)
                    .or(policy.timeouts().1),
            )
        };
        // A gRPC caller's own timeout bounds every attempt together, as its deadline.
        let deadline = match grpc.flatten() {
            Some(timeout) if !outer_layer => Some(deadline.map_or(timeout, |d| d.min(timeout))),
            _ => deadline,
        };
        let mut target = target;
        // Set in place: a select over the whole target copied it (method and URI) per request.
        if grpc.is_some() {
            target.mark_grpc_call();
        }
        if !outer_layer {
            policy.deposit();
        }
        let now = SystemTime::now();
        let own_at = deadline.and_then(|d| Instant::now().checked_add(d));
        let (deadline_at, caller_deadline) = match inbound {
            Some(inbound) if !outer_layer => deadline::earliest(policy, own_at, inbound),
            _ => (own_at, false),
        };
        Attempts {
            policy: policy.clone(),
            verdict,
            target,
            not_replayable,
            outer_layer,
            max_retries,
            attempt_timeout,
            deadline_at,
            first_attempt_at: now,
            last_attempt_at: now,
            outcomes: Outcomes::default(),
            request_id,
            idempotency_key,
            last_stop: StopReason::Final,
            grpc: grpc.is_some() && !outer_layer,
            caller_deadline,
            never_sent: false,
            sends_deadline: sends_deadline.filter(|_| !outer_layer),
            wired_limit: None,
            stack,
            hedge: None,
            span: None,
        }
    }

    /// The policy deciding.
    pub(crate) fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// Whether the request is a gRPC call.
    #[inline]
    pub(crate) fn is_grpc(&self) -> bool {
        self.grpc
    }

    /// The request's target: kept once, here, for messages and for resending the request.
    pub(crate) fn target(&self) -> &Target {
        &self.target
    }

    /// Decides after an attempt: wait and send again, or stop. `resend` says whether the front
    /// end can send the body again (`None`: it kept nothing to send it with; `Some(Err)`: what
    /// it kept can no longer be sent, and why).
    #[inline]
    pub(crate) fn on_outcome(
        &mut self,
        outcome: Outcome<'_>,
        resend: Option<Result<(), NotReplayable>>,
    ) -> Step {
        if self.hedge.is_some() {
            self.record_latency(None, &outcome);
        }
        self.decide_outcome(outcome, resend)
    }

    /// [`on_outcome`](Self::on_outcome) without counting the attempt's latency.
    #[inline]
    fn decide_outcome(
        &mut self,
        outcome: Outcome<'_>,
        resend: Option<Result<(), NotReplayable>>,
    ) -> Step {
        if let Some(Err(why)) = resend {
            self.refuse_replay(why);
        }
        let decision = match outcome {
            Outcome::Response {
                status,
                headers,
                extensions,
            } => self.on_response(status, headers, extensions),
            Outcome::Error(err) => self.on_error(err),
            // The attempt whose body streamed on was recorded at its head: its record
            // becomes the cut's.
            Outcome::BodyCut { status, received } => {
                self.outcomes.pop_last();
                self.on_body_cut(status, &HeaderMap::new(), received)
            }
        };
        match decision {
            // A refused body stops in `decide`; without a copy nothing is ever resent.
            Decision::Retry { after } if resend.is_some() => Step::Wait(after),
            Decision::Retry { .. } => Step::Stop(StopReason::BodyNotReplayable),
            Decision::Stop(reason) => Step::Stop(reason),
        }
    }

    /// The outcome the caller gets: the last attempt's response with the report in its
    /// extensions, or this crate's error around the last attempt's error. `self` is spent.
    #[inline]
    pub(crate) fn finish<R: CarriesReport>(
        &mut self,
        result: Result<R, BoxError>,
        reason: StopReason,
    ) -> Result<R, Error> {
        match result {
            Ok(mut res) => {
                // An outer layer of this crate writes the report; ours would be overwritten.
                if reason != StopReason::RetriedByOuterLayer {
                    let extensions = res.extensions_mut();
                    // Most responses carry no extension: nothing to take out of them.
                    if !extensions.is_empty() {
                        self.take_body_marks(extensions, reason);
                    }
                    // The report goes straight into the extensions (held in a local, it was
                    // copied once more per request); a gRPC call's status marks, out of line.
                    if self.grpc {
                        self.report_grpc(&mut res, reason);
                    } else {
                        res.extensions_mut().insert(self.take_report(reason));
                    }
                }
                Ok(res)
            }
            Err(err) => Err(self.take_error(reason, err)),
        }
    }

    /// [`finish`](Self::finish)'s report for a gRPC call: its status carries the attempts
    /// and whether it may have been applied too.
    #[cold]
    fn report_grpc<R: CarriesReport>(&mut self, res: &mut R, reason: StopReason) {
        let report = self.take_report(reason);
        crate::classify::grpc::mark_status(
            res.headers_mut(),
            report.attempts(),
            report.may_have_been_applied(),
        );
        res.extensions_mut().insert(report);
    }

    /// The error for a request whose retry could not start because its body could not be
    /// sent again after all (the last attempt's outcome was already dropped for the retry).
    /// `self` is spent.
    #[cold]
    #[cfg_attr(not(feature = "reqwest-middleware"), allow(dead_code))]
    pub(crate) fn finish_refused(&mut self, why: NotReplayable) -> Error {
        self.refuse_replay(why);
        self.take_error(StopReason::BodyNotReplayable, why.to_string().into())
    }

    /// The request's body can no longer be sent again. The first reason found is kept.
    #[cold]
    pub(crate) fn refuse_replay(&mut self, why: NotReplayable) {
        self.not_replayable.get_or_insert(why);
    }

    /// Marks the start of the next attempt, and numbers it in the request's headers when the
    /// policy has an attempt header.
    #[inline]
    pub(crate) fn next_attempt(&mut self, headers: &mut HeaderMap) -> u32 {
        let (number, hedge) = match &mut self.hedge {
            None => (self.outcomes.len() + 1, false),
            Some(run) => run.sent(),
        };
        self.open_span(number, hedge);
        if number > 1 {
            self.last_attempt_at = SystemTime::now();
            // A resend that is not a hedge, in the policy's instruments: one check without a
            // meter, and none for a first attempt.
            #[cfg(feature = "opentelemetry")]
            if let (false, Some(metrics)) = (hedge, self.policy.metrics()) {
                let last = self.outcomes.iter().last();
                metrics.retry(
                    &self.target,
                    self.verdict.source(),
                    last.map_or(crate::classify::FailureClass::Ambiguous, |r| r.class),
                    last.and_then(|r| r.delay),
                );
            }
        }
        if let Some(name) = &self.policy.headers().attempt_header {
            headers.insert(name.clone(), HeaderValue::from(number));
        }
        if self.grpc {
            crate::classify::grpc::mark_attempt(headers, number, self.attempt_wait());
        } else if let Some(convention) = self.sends_deadline {
            deadline::mark(headers, convention, number, self.attempt_wait());
        }
        number
    }

    /// `extensions` are the response's: a body classifier inside the layer leaves its verdict
    /// there.
    pub(crate) fn on_response(
        &mut self,
        status: StatusCode,
        headers: &HeaderMap,
        extensions: &Extensions,
    ) -> Decision {
        if self.request_id.is_none() {
            if let Some(name) = &self.policy.headers().request_id_header {
                self.request_id = printable(headers.get(name), MAX_REQUEST_ID_LEN);
            }
        }
        if let Some(cut) = extensions.get::<BodyCut>() {
            return self.on_body_cut(status, headers, cut.received);
        }
        let body_verdict = extensions.get::<BodyVerdict>().map(|v| v.0);
        let outcome = self.policy.classify_status(
            &self.verdict,
            status,
            headers,
            body_verdict,
            self.is_grpc(),
        );
        self.decide(outcome, Some(status))
    }

    pub(crate) fn on_error(&mut self, err: &(dyn StdError + 'static)) -> Decision {
        // Whether it may have been applied is read from the records: not sent, or a request the
        // client refused to build (final), did not reach the server.
        let class = classify_error_with(err, self.stack);
        self.decide(class.into(), None)
    }

    #[inline]
    fn decide(&mut self, outcome: Classification, status: Option<StatusCode>) -> Decision {
        self.decide_cut(outcome, status, None)
    }

    /// `body_cut`: the bytes of the response body that arrived before it was cut, if it was.
    fn decide_cut(
        &mut self,
        outcome: Classification,
        status: Option<StatusCode>,
        body_cut: Option<u64>,
    ) -> Decision {
        self.outcomes.push(AttemptOutcome {
            class: outcome.class(),
            status,
            delay: None,
            body_cut,
        });
        let attempt = self.outcomes.len();
        let decision = if self.outer_layer {
            Decision::Stop(StopReason::RetriedByOuterLayer)
        } else {
            let time_left = self.time_left();
            let facts = Facts {
                verdict: &self.verdict,
                outcome: &outcome,
                retries_done: attempt - 1,
                max_retries: self.max_retries,
                time_left,
                replayable: self.not_replayable.is_none(),
            };
            let policy = &self.policy;
            match policy.decide_with(facts, || policy.jitter_unit(), || policy.withdraw()) {
                Decision::Stop(StopReason::Deadline) => Decision::Stop(self.deadline_reason()),
                decision => decision,
            }
        };
        if let Decision::Retry { after } = decision {
            if let Some(last) = self.outcomes.last_mut() {
                last.delay = Some(after);
            }
        }
        // While hedging, outcomes come in any order: name the attempt decided on, not the
        // count of outcomes.
        let attempt = match &mut self.hedge {
            None => attempt,
            Some(run) => run.deciding.take().unwrap_or(attempt),
        };
        self.log(attempt, &outcome, status, decision);
        if self.span.is_some() {
            let decided = match decision {
                Decision::Retry { .. } => "retry",
                Decision::Stop(reason) => reason.as_str(),
            };
            self.record_span(&outcome, status, decided);
        }
        if let Some(hook) = self.policy.on_attempt() {
            (hook.0)(&AttemptEvent {
                method: &self.target.method,
                path: self.target.path(),
                attempt,
                class: outcome.class(),
                status,
                verdict_source: self.verdict.source(),
                decision,
            });
        }
        decision
    }
}

#[cfg(test)]
mod grpc_tests;
#[cfg(test)]
mod hedge_tests;
#[cfg(test)]
mod report_cells;
#[cfg(test)]
mod tests;
