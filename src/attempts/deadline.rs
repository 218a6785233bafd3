//! The request's deadline and each attempt's clock, as the core reads them: how long is left,
//! what cuts an attempt, and the request's end when the deadline passes before a resend.

use std::time::Duration;

use tokio::time::Instant;

use super::*;

impl Attempts {
    /// When the request's deadline passes, if it has one.
    #[inline]
    pub(crate) fn deadline_at(&self) -> Option<Instant> {
        self.deadline_at
    }

    /// Time before the request's deadline, if it has one.
    #[inline]
    pub(crate) fn time_left(&self) -> Option<Duration> {
        self.deadline_at
            .map(|at| at.saturating_duration_since(Instant::now()))
    }

    /// How long the next attempt may take before the policy's clock cuts it, and why it would
    /// be cut: the per-attempt timeout, or the deadline if it comes first. `None` without
    /// either (no timer at all).
    #[inline]
    pub(crate) fn attempt_limit(&self) -> Option<(Duration, TimedOut)> {
        match (self.attempt_timeout, self.time_left()) {
            (Some(attempt), Some(left)) if attempt < left => Some((attempt, TimedOut::Attempt)),
            (_, Some(left)) => Some((left, TimedOut::Deadline)),
            (Some(attempt), None) => Some((attempt, TimedOut::Attempt)),
            (None, None) => None,
        }
    }

    /// How long a front end waits, after the backoff, for the last attempt's transport to let
    /// go of a recorded body: [`LET_GO_WAIT`], or less if the deadline comes first.
    #[inline]
    pub(crate) fn body_wait(&self) -> Duration {
        self.time_left()
            .map_or(LET_GO_WAIT, |left| left.min(LET_GO_WAIT))
    }

    /// Whether the request's deadline has passed: nothing more is handed to the inner service
    /// (a resend that waited for it to be ready past the deadline is not sent).
    #[inline]
    pub(crate) fn past_deadline(&self) -> bool {
        self.time_left() == Some(Duration::ZERO)
    }

    /// The outcome for a request whose next attempt was not sent because the deadline passed
    /// before the inner service was ready for it (the last attempt's outcome was already
    /// dropped for the retry): an error, stopped on the deadline, and said so in the log.
    #[cold]
    pub(crate) fn stop_at_deadline<R>(&self) -> (Result<R, BoxError>, StopReason) {
        let reason = self.deadline_reason();
        tracing::warn!(
            http.request.method = %self.target.method,
            url.path = self.target.path(),
            http.request.resend_count = self.outcomes.len(),
            reason = reason.as_str(),
            "retry refused: the deadline passed while the service was getting ready"
        );
        (Err(DEADLINE_BEFORE_SEND.into()), reason)
    }

    /// Whether the caller's deadline (less the margin) has passed before the first attempt:
    /// nobody would read its answer, so it is not sent.
    #[inline]
    pub(crate) fn caller_gone(&self) -> bool {
        self.caller_deadline && self.past_deadline()
    }

    /// The outcome of a request not sent at all because its caller's deadline had passed
    /// ([`caller_gone`](Self::caller_gone)): no attempt, stopped on the caller's deadline.
    #[cold]
    pub(crate) fn refuse_at_caller_deadline<R>(&mut self) -> (Result<R, BoxError>, StopReason) {
        self.never_sent = true;
        tracing::debug!(
            http.request.method = %self.target.method,
            url.path = self.target.path(),
            reason = StopReason::CallerDeadline.as_str(),
            "request not sent: the caller's deadline has passed"
        );
        (Err(CALLER_GONE.into()), StopReason::CallerDeadline)
    }

    /// Why a request stops on its deadline: its own, or its caller's.
    pub(crate) fn deadline_reason(&self) -> StopReason {
        if self.caller_deadline {
            StopReason::CallerDeadline
        } else {
            StopReason::Deadline
        }
    }

    /// Whether the attempts carry the deadline headers of an HTTP host that asked for them.
    #[cfg_attr(not(feature = "reqwest-middleware"), allow(dead_code))]
    pub(crate) fn sends_deadline(&self) -> bool {
        self.sends_deadline.is_some()
    }

    /// How long the client waits for the attempt about to be sent: its attempt timeout or
    /// the deadline, whichever comes first. What goes on the wire: a callee that works past
    /// it works for nobody.
    #[inline]
    pub(super) fn attempt_wait(&mut self) -> Option<Duration> {
        let limit = self.attempt_limit();
        self.wired_limit = limit;
        limit.map(|(limit, _)| limit)
    }

    /// Bounds the wait the attempt just numbered carries on the wire by `cap`, a timeout of
    /// the client's own below the layer (reqwest's per-request `timeout`): the client stops
    /// waiting at the earlier of the two.
    #[cfg_attr(not(feature = "reqwest-middleware"), allow(dead_code))]
    pub(crate) fn cap_wire_wait(&mut self, headers: &mut HeaderMap, cap: Duration) {
        let Some(convention) = self.sends_deadline else {
            return;
        };
        if self.wired_limit.is_none_or(|(limit, _)| limit > cap) {
            headers.insert(
                convention.timeout_header(),
                crate::deadline::timeout_value(cap),
            );
        }
    }

    /// [`attempt_limit`](Self::attempt_limit) for the attempt just numbered by
    /// [`next_attempt`](Self::next_attempt): the very limit its headers carry, when they
    /// carry one (so its timer never waits less than the wire says), else read now.
    #[inline]
    pub(crate) fn sent_attempt_limit(&mut self) -> Option<(Duration, TimedOut)> {
        self.wired_limit.take().or_else(|| self.attempt_limit())
    }
}

/// Writes the attempt's wait and its number in `convention`'s headers, for a host that reads
/// them.
pub(super) fn mark(
    headers: &mut HeaderMap,
    convention: crate::deadline::Convention,
    number: u32,
    wait: Option<Duration>,
) {
    if let Some(wait) = wait {
        headers.insert(
            convention.timeout_header(),
            crate::deadline::timeout_value(wait),
        );
    }
    let Some(name) = convention.attempt_header() else {
        return;
    };
    // The first attempts' numbers without an allocation each.
    let value = match number {
        1 => HeaderValue::from_static("1"),
        2 => HeaderValue::from_static("2"),
        3 => HeaderValue::from_static("3"),
        _ => HeaderValue::from(number),
    };
    headers.insert(name, value);
}

/// The error of a request not sent because its caller's deadline had passed.
const CALLER_GONE: &str = "the caller's deadline passed before the request could be sent";

/// The earlier of the request's own deadline and the inbound one less the policy's margin,
/// and whether it is the inbound one.
pub(super) fn earliest(
    policy: &RetryPolicy,
    own: Option<Instant>,
    inbound: crate::deadline::Inbound,
) -> (Option<Instant>, bool) {
    let theirs = inbound.deadline();
    // A margin longer than the time since the clock's start: the deadline is now.
    let theirs = theirs
        .checked_sub(policy.hops().margin)
        .unwrap_or_else(Instant::now);
    match own {
        Some(own) if own <= theirs => (Some(own), false),
        _ => (Some(theirs), true),
    }
}

/// Retries allowed: the request's option or the policy's, and no more than the policy allows
/// a nested call whose caller retries.
pub(super) fn retries_for(policy: &RetryPolicy, plan: &Plan) -> u32 {
    let max = plan.max_retries(policy);
    match (plan.inbound, policy.hops().retries_when_caller_retries) {
        (Some(inbound), Some(cap)) if inbound.caller_retries() => max.min(cap),
        _ => max,
    }
}
