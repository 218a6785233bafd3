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
        tracing::warn!(
            http.request.method = %self.target.method,
            url.path = self.target.path(),
            http.request.resend_count = self.records.len(),
            reason = StopReason::Deadline.as_str(),
            "retry refused: the deadline passed while the service was getting ready"
        );
        (Err(DEADLINE_BEFORE_SEND.into()), StopReason::Deadline)
    }
}
