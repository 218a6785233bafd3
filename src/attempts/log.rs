//! The `tracing` event of each decision.

use http::StatusCode;

use super::Attempts;
use crate::classify::{Classification, FailureClass};
use crate::policy::{Decision, StopReason};

impl Attempts {
    /// One event per decision that is not the plain end of a request, with OpenTelemetry's
    /// HTTP field names where one exists. A retry is `debug`; a suppressed retry, and a retry
    /// that was refused though the failure called for one (budget, body, deadline, a wait too
    /// long), are `warn`: an operator should see those.
    pub(super) fn log(
        &self,
        attempt: u32,
        outcome: &Classification,
        status: Option<StatusCode>,
        decision: Decision,
    ) {
        // The fields every attempt event carries, then the event's own. Computed inside the
        // event, which evaluates them only when a subscriber wants it: the plain end of a
        // request pays for none.
        macro_rules! event {
            ($level:expr, $($rest:tt)*) => {
                tracing::event!(
                    $level,
                    http.request.method = %self.target.method,
                    url.path = self.target.path(),
                    attempt,
                    http.request.resend_count = attempt - 1,
                    error.r#type = outcome.class().as_str(),
                    http.response.status_code = status.map(|s| s.as_u16()),
                    $($rest)*
                )
            };
        }
        use tracing::Level;
        match decision {
            Decision::Retry { after } => event!(
                Level::DEBUG,
                delay_ms = after.as_millis() as u64,
                "retrying request"
            ),
            Decision::Stop(StopReason::SuppressedNotIdempotent) => event!(
                Level::WARN,
                verdict_source = self.verdict.source().as_str(),
                request_id = self.request_id.as_deref(),
                idempotency_key_untrusted = self.idempotency_key.is_some(),
                "retry suppressed: the request is not idempotent and may have been applied"
            ),
            Decision::Stop(StopReason::StoredResponse) => event!(
                Level::DEBUG,
                request_id = self.request_id.as_deref(),
                "not retrying request: the response is the server's stored response"
            ),
            Decision::Stop(
                reason @ (StopReason::Budget
                | StopReason::BodyNotReplayable
                | StopReason::Deadline
                | StopReason::CallerDeadline
                | StopReason::RetryAfterTooLong),
            ) if outcome.class() != FailureClass::Final
                || reason == StopReason::RetryAfterTooLong =>
            {
                event!(
                    Level::WARN,
                    reason = reason.as_str(),
                    request_id = self.request_id.as_deref(),
                    "retry refused"
                )
            }
            Decision::Stop(reason) if outcome.class() != FailureClass::Final => event!(
                Level::DEBUG,
                reason = reason.as_str(),
                "not retrying request"
            ),
            Decision::Stop(_) => {}
        }
    }
}
