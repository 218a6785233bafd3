use std::fmt;
use std::time::{Duration, SystemTime};

use http::StatusCode;

use super::NotReplayable;
use crate::classify::{FailureClass, RequestVerdict};
use crate::policy::StopReason;

/// One attempt, as the report keeps it: how it ended, and the wait after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttemptOutcome {
    pub(crate) class: FailureClass,
    pub(crate) status: Option<StatusCode>,
    pub(crate) delay: Option<Duration>,
    /// The bytes of the response body that arrived before it was cut, when it was cut while
    /// read inside the attempt.
    pub(crate) body_cut: Option<u64>,
}

impl AttemptOutcome {
    /// Whether this attempt may have reached the server's application: any response but one
    /// classified as proof that nothing was applied, and any failure after it may have been
    /// sent.
    fn may_have_been_applied(&self) -> bool {
        match self.class {
            FailureClass::NotSent => false,
            FailureClass::Ambiguous | FailureClass::RetryableResponse => true,
            // A final error (the request could not be built) was never sent; a final response
            // came from the server.
            FailureClass::Final => self.status.is_some(),
        }
    }

    /// How the attempt ended: [`FailureClass::Final`] for a success.
    pub fn class(&self) -> FailureClass {
        self.class
    }

    /// The response status, if the attempt got a response.
    pub fn status(&self) -> Option<StatusCode> {
        self.status
    }

    /// The wait before the next attempt, if there was one.
    pub fn delay(&self) -> Option<Duration> {
        self.delay
    }

    /// When the server answered but the response body was cut before its end (behind
    /// [`ReadWholeLayer`](crate::resume::ReadWholeLayer)): how many bytes of it had arrived (for a
    /// body that streamed to the caller, how many the caller had when it was resumed).
    /// Such an attempt is [`Ambiguous`](FailureClass::Ambiguous): the server had run the
    /// request.
    ///
    /// ```
    /// # fn show(report: &tower_retry_safety::RetryReport) {
    /// for (n, attempt) in report.attempt_outcomes().enumerate() {
    ///     if let Some(bytes) = attempt.body_cut_after() {
    ///         println!("attempt {}: body cut after {bytes} bytes", n + 1);
    ///     }
    /// }
    /// # }
    /// ```
    pub fn body_cut_after(&self) -> Option<u64> {
        self.body_cut
    }
}

/// What happened to a request: put in a response's extensions by the layer and the
/// reqwest adapter, and kept inside every [`Error`](crate::attempts::Error).
///
/// It covers the attempts up to the response head. Reading the body comes after the layer has
/// returned: an error there is never retried and never appears here — unless
/// [`ReadWholeLayer`](crate::resume::ReadWholeLayer) makes the body part of the attempt (a cut is then
/// an attempt here, and a resumed body's [`WholeBody::report`](crate::resume::WholeBody::report)
/// covers its resumes). Without it, the status was final by then, so treat a body-read error
/// on a write as ambiguous and check before repeating it; send a read again; retry a keyed
/// write by hand with the same key ([`idempotency_key`](Self::idempotency_key)) so the server
/// can send its stored response again.
///
/// ```
/// # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// use tower::{service_fn, Layer, ServiceExt};
/// use tower_retry_safety::{RetryPolicy, RetryReport, StopReason};
///
/// let policy = RetryPolicy::builder().build()?;
/// let svc = policy.layer(service_fn(|_req: http::Request<String>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new("done"))
/// }));
/// let res = svc.oneshot(http::Request::post("/v1/messages").body(String::new())?).await?;
/// let report = RetryReport::of(&res).expect("the layer adds a report");
/// assert_eq!(report.attempts(), 1);
/// assert_eq!(report.stop_reason(), StopReason::Final);
/// assert!(!report.retry_suppressed());
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
#[derive(Clone)]
pub struct RetryReport {
    pub(crate) verdict: RequestVerdict,
    pub(crate) outcomes: Outcomes,
    pub(crate) stop: StopReason,
    pub(crate) first_attempt_at: SystemTime,
    pub(crate) last_attempt_at: SystemTime,
    pub(crate) request_id: Option<Box<str>>,
    pub(crate) idempotency_key: Option<Box<str>>,
    /// Why the body could not be sent again, when that stopped the retries.
    pub(crate) body: Option<NotReplayable>,
    pub(crate) hedging: HedgeSummary,
}

/// What hedging did for a request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct HedgeSummary {
    /// Backup attempts sent because the ones in flight were slow.
    pub(crate) hedges: u32,
    /// The attempt (numbered in the order sent) whose response was returned, when hedges
    /// were sent.
    pub(crate) won_by: Option<u32>,
    /// Attempts still in flight when another's outcome was returned: dropped, their outcome
    /// unknown.
    pub(crate) superseded: u32,
}

impl RetryReport {
    /// The report the layer put in a response's extensions; `None` when the response did not
    /// come through it. For a reqwest response, see `of_reqwest` (feature
    /// `reqwest-middleware`).
    pub fn of<B>(res: &http::Response<B>) -> Option<&RetryReport> {
        res.extensions().get()
    }

    /// How many attempts were sent (1 when there was no retry and no hedge), counting the
    /// attempts that lost to a hedge and were dropped
    /// ([`superseded`](Self::superseded)), which have no record.
    pub fn attempts(&self) -> u32 {
        self.outcomes.len() + self.hedging.superseded
    }

    /// How many backup attempts were sent because the attempts in flight were slow (see
    /// [`Hedge`](crate::hedge::Hedge)); 0 without hedging.
    pub fn hedges(&self) -> u32 {
        self.hedging.hedges
    }

    /// When hedges were sent and a response was returned: which attempt's it is, numbered
    /// from 1 in the order the attempts were sent (1 is the first attempt, 2 the first hedge
    /// or retry…).
    pub fn won_by(&self) -> Option<u32> {
        self.hedging.won_by
    }

    /// Attempts still in flight when another attempt's outcome was returned: they were
    /// dropped, and their outcome is unknown. Each counts as maybe applied in
    /// [`may_have_been_applied`](Self::may_have_been_applied).
    pub fn superseded(&self) -> u32 {
        self.hedging.superseded
    }

    /// True when a retry was withheld because the request is not idempotent and may have
    /// been applied: the caller should check the outcome before repeating it by hand.
    pub fn retry_suppressed(&self) -> bool {
        self.stop == StopReason::SuppressedNotIdempotent
    }

    /// True when the request may have been applied by the server: it can change the server's
    /// state (anything but a read: see [`RequestVerdict::can_apply`]) and some attempt reached it
    /// (any response, unless it was classified as proof that nothing was applied: a
    /// [`not_applied_statuses`](crate::RetryPolicyBuilder::not_applied_statuses) status or a
    /// classifier's [`NotSent`](crate::classify::FailureClass::NotSent)), or failed after it may have
    /// been sent. False only when no attempt can have reached the server's application.
    ///
    /// This is the question to ask before telling a caller that a write did not happen. It
    /// holds whatever stopped the retries: a suppressed retry, retries used up on 409 ("still
    /// in flight") after a timed-out attempt, a [stored response](StopReason::StoredResponse): a stored
    /// response (the server ran the write), an error response after an earlier ambiguous
    /// attempt. A success was applied, so it answers true too. The same answer as
    /// [`Error::may_have_been_applied`](crate::attempts::Error::may_have_been_applied) for the
    /// attempts an error ends.
    ///
    /// ```
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// use tower::{service_fn, Layer, ServiceExt};
    /// use tower_retry_safety::{RetryPolicy, RetryReport};
    ///
    /// let policy = RetryPolicy::builder().build()?;
    /// let svc = policy.layer(service_fn(|_req: http::Request<String>| async {
    ///     let res = http::Response::builder().status(503).body(String::new());
    ///     Ok::<_, http::Error>(res?)
    /// }));
    /// let res = svc.oneshot(http::Request::post("/v1/messages").body(String::new())?).await?;
    /// let report = RetryReport::of(&res).expect("the layer adds a report");
    /// assert!(report.retry_suppressed());
    /// assert!(report.may_have_been_applied()); // a 503 may come after the write
    /// # Ok(()) }
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
    /// ```
    pub fn may_have_been_applied(&self) -> bool {
        self.verdict.can_apply() && self.reached_the_server()
    }

    /// Whether some attempt may have reached the server's application, whatever the request:
    /// what [`may_have_been_applied`](Self::may_have_been_applied) answers for a request that
    /// can change the server's state.
    pub(crate) fn reached_the_server(&self) -> bool {
        self.hedging.superseded > 0
            || self
                .outcomes
                .iter()
                .any(AttemptOutcome::may_have_been_applied)
    }

    /// True when the response is the server's stored response (its first answer) to an earlier
    /// attempt with the same idempotency key ([`StopReason::StoredResponse`]): the server had already
    /// run the request, and a repeat with the key gets the same answer. A stored 5xx means
    /// the write ran and then failed on the server: check the resource's state, and do not send
    /// the request again with a new key.
    pub fn is_stored_response(&self) -> bool {
        self.stop == StopReason::StoredResponse
    }

    /// True when the request carried a well-formed idempotency key that the policy does not
    /// trust its target to honour, so the key did not make a repeat harmless: a write was
    /// treated as one without a key. Trust a target with
    /// [`honor_idempotency_key_for_host`](crate::RetryPolicyBuilder::honor_idempotency_key_for_host)
    /// (or, for a route, [`route_honors_idempotency_key`](crate::RetryPolicyBuilder::route_honors_idempotency_key));
    /// unscoped trust ([`honor_idempotency_key`](crate::RetryPolicyBuilder::honor_idempotency_key),
    /// or minting keys with no host named) does not cover a request that a marker or a route
    /// rule calls [`NonIdempotent`](crate::classify::Idempotency::NonIdempotent).
    pub fn idempotency_key_untrusted(&self) -> bool {
        self.idempotency_key.is_some()
            && !self.verdict.is_no_retry()
            && !self.verdict.keys_honored()
    }

    /// Why the request's body could not be sent again, when that is why retries stopped
    /// ([`StopReason::BodyNotReplayable`]): a stream the layer does not record, a body over
    /// the replay buffer's limit (with the limit), a response before the body's end…
    pub fn body_not_replayable(&self) -> Option<NotReplayable> {
        self.body
    }

    /// Whether a repeat was harmless, and which rule said so.
    pub fn verdict(&self) -> RequestVerdict {
        self.verdict
    }

    /// Why there was no further attempt.
    pub fn stop_reason(&self) -> StopReason {
        self.stop
    }

    /// Each attempt, first to last.
    pub fn attempt_outcomes(&self) -> impl Iterator<Item = &AttemptOutcome> + '_ {
        self.outcomes.iter()
    }

    /// When the first attempt started.
    pub fn first_attempt_at(&self) -> SystemTime {
        self.first_attempt_at
    }

    /// When the last attempt started.
    pub fn last_attempt_at(&self) -> SystemTime {
        self.last_attempt_at
    }

    /// The request id, from the policy's request-id header on the request or the response
    /// (capped at 128 bytes; absent when it was not printable ASCII).
    pub fn request_id(&self) -> Option<&str> {
        self.request_id.as_deref()
    }

    /// The idempotency key the request carried, if any: the same on every attempt.
    pub fn idempotency_key(&self) -> Option<&str> {
        self.idempotency_key.as_deref()
    }
}

impl fmt::Debug for RetryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryReport")
            .field("attempts", &self.attempts())
            .field("verdict", &self.verdict)
            .field("stop", &self.stop)
            .field("outcomes", &self.outcomes.iter().collect::<Vec<_>>())
            .field("request_id", &self.request_id)
            .field("idempotency_key", &self.idempotency_key)
            .field("body_not_replayable", &self.body)
            .field("hedging", &self.hedging)
            .field("may_have_been_applied", &self.may_have_been_applied())
            .field(
                "idempotency_key_untrusted",
                &self.idempotency_key_untrusted(),
            )
            .finish()
    }
}

/// One sentence on how the request ended and what it means for a write: for a caller's own
/// message or log line. It names no method, path or header value.
///
/// ```
/// # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// use tower::{service_fn, Layer, ServiceExt};
/// use tower_retry_safety::{RetryPolicy, RetryReport};
///
/// let policy = RetryPolicy::builder().build()?;
/// let svc = policy.layer(service_fn(|_req: http::Request<String>| async {
///     // A server that honours keys sends its stored 503 again: the handler ran and failed.
///     let res = http::Response::builder()
///         .status(503)
///         .header("idempotent-replayed", "true")
///         .body(String::new());
///     Ok::<_, http::Error>(res?)
/// }));
/// let req = http::Request::post("/v1/messages").header("idempotency-key", "\"k-1\"");
/// let res = svc.oneshot(req.body(String::new())?).await?;
/// let report = RetryReport::of(&res).expect("the layer adds a report");
/// assert!(report.is_stored_response());
/// assert!(report.to_string().contains("had already run the request"));
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
impl fmt::Display for RetryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let attempts = self.attempts();
        let plural = if attempts == 1 { "" } else { "s" };
        let status = self.outcomes.iter().last().and_then(|r| r.status);
        write!(f, "{attempts} attempt{plural}")?;
        if self.hedging.hedges > 0 {
            write!(f, " ({} hedged", self.hedging.hedges)?;
            if let Some(won) = self.hedging.won_by {
                write!(f, ", attempt {won} answered first")?;
            }
            f.write_str(")")?;
        }
        if let Some(status) = status {
            write!(f, ", last answered {status}")?;
        }
        if let Some(cut) = self.outcomes.iter().last().and_then(|r| r.body_cut) {
            write!(f, ", its body cut after {cut} bytes")?;
        }
        match self.stop {
            StopReason::StoredResponse => {
                f.write_str(
                    "; the response is the server's stored response to an \
                     earlier attempt with the same idempotency key: the server had already run \
                     the request",
                )?;
                if status.is_some_and(|s| s.is_server_error()) {
                    f.write_str(
                        " and it failed there. Repeating the key gets the same answer; check \
                         the resource's state before sending the request again with a new key",
                    )?;
                }
            }
            StopReason::SuppressedNotIdempotent => f.write_str(
                "; not retried: the request is not idempotent and may have been applied",
            )?,
            reason => write!(f, "; stopped: {}", reason.as_str())?,
        }
        if self.stop != StopReason::StoredResponse && self.verdict.can_apply() {
            f.write_str(if self.may_have_been_applied() {
                "; it may have been applied"
            } else {
                "; it was not applied"
            })?;
        }
        if self.verdict.host_unknown() {
            f.write_str(
                "; its host was not visible to the layer, so rules and key trust scoped to hosts \
                 applied failing closed (see `RetryPolicy::for_origin`)",
            )?;
        }
        if self.idempotency_key_untrusted() && !self.verdict.repeat_is_harmless() {
            f.write_str(
                "; it carried an idempotency key that is not trusted for this target \
                 (see `honor_idempotency_key_for_host`)",
            )?;
        }
        Ok(())
    }
}

/// The attempts, with the first one inline: a request that succeeds at once allocates nothing
/// here.
#[derive(Clone, Debug, Default)]
pub(crate) struct Outcomes {
    first: Option<AttemptOutcome>,
    rest: Vec<AttemptOutcome>,
}

impl Outcomes {
    pub(crate) fn push(&mut self, outcome: AttemptOutcome) {
        if self.first.is_none() {
            self.first = Some(outcome);
        } else {
            self.rest.push(outcome);
        }
    }

    /// Removes the last attempt's record, to record it again.
    pub(crate) fn pop_last(&mut self) -> Option<AttemptOutcome> {
        self.rest.pop().or_else(|| self.first.take())
    }

    pub(crate) fn last_mut(&mut self) -> Option<&mut AttemptOutcome> {
        match self.rest.last_mut() {
            Some(last) => Some(last),
            None => self.first.as_mut(),
        }
    }

    pub(crate) fn len(&self) -> u32 {
        (self.first.is_some() as usize + self.rest.len()) as u32
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &AttemptOutcome> + '_ {
        self.first.iter().chain(self.rest.iter())
    }
}
