//! How a request's bookkeeping ends: the report the caller gets, or the error around the last
//! attempt's failure.

use super::Attempts;
use super::Error;
use super::RetryReport;
use crate::box_error::BoxError;
use crate::classify::{FailureClass, Symptom};
use crate::policy::StopReason;

impl Attempts {
    /// The report, its parts taken out of `self`, which is spent afterwards.
    #[inline]
    pub(crate) fn take_report(&mut self, stop: StopReason) -> RetryReport {
        // The request's end, in the policy's instruments: one check without a meter.
        #[cfg(feature = "opentelemetry")]
        if let Some(metrics) = self.policy.metrics() {
            self.count_end(metrics, stop);
        }
        RetryReport {
            verdict: self.verdict,
            outcomes: std::mem::take(&mut self.outcomes),
            stop,
            first_attempt_at: self.first_attempt_at,
            last_attempt_at: self.last_attempt_at,
            request_id: self.request_id.take(),
            idempotency_key: self.idempotency_key.take(),
            body: match stop {
                StopReason::BodyNotReplayable => self.not_replayable,
                _ => None,
            },
            hedging: self
                .hedge
                .as_ref()
                .map_or_else(Default::default, |h| h.summary()),
        }
    }

    /// The error for a request whose last attempt ended in `source`; `self` is spent.
    pub(super) fn take_error(&mut self, stop: StopReason, source: BoxError) -> Error {
        // An inner layer of this crate already wrapped the transport error: unwrap it so the
        // chain reads caller → transport, not caller → layer → layer → transport.
        let source = match source.downcast::<Error>() {
            Ok(inner) => inner.into_source().unwrap_or_else(|inner| Box::new(inner)),
            Err(other) => other,
        };
        // No attempt at all: nothing was sent (the caller's deadline had passed).
        let unknown = if self.never_sent {
            FailureClass::NotSent
        } else {
            FailureClass::Ambiguous
        };
        let class = self.outcomes.iter().last().map_or(unknown, |r| r.class);
        let symptom = Symptom::of(&*source, self.stack);
        let target = self.target.clone();
        let report = self.take_report(stop);
        // Ambiguous: any response but proof that nothing was applied, or a failure after the
        // request may have been sent. The report adds whether the request can apply anything.
        let maybe_applied = report.reached_the_server();
        Error::after_attempts(target, report, class, maybe_applied, symptom, source)
    }
}

#[cfg(feature = "opentelemetry")]
impl Attempts {
    /// Counts the request's end in the policy's instruments: its attempts, and whether a
    /// write was suppressed, a retry refused, or the server's stored response received. An
    /// inner layer of this crate counts nothing: the outer one owns the request.
    #[cold]
    fn count_end(&self, metrics: &crate::metrics::client::ClientInstruments, stop: StopReason) {
        if self.outer_layer || stop == StopReason::RetriedByOuterLayer {
            return;
        }
        let hedging = self.hedge.as_ref().map(|h| h.summary()).unwrap_or_default();
        let ended = crate::metrics::client::Ended {
            attempts: self.outcomes.len() + hedging.superseded,
            stop: crate::metrics::client::Label {
                ordinal: stop as usize,
                name: stop.as_str(),
            },
            suppressed: stop == StopReason::SuppressedNotIdempotent,
            // A request never sent had no retry to refuse.
            refused: !self.never_sent
                && matches!(
                    stop,
                    StopReason::Budget
                        | StopReason::Deadline
                        | StopReason::CallerDeadline
                        | StopReason::BodyNotReplayable
                        | StopReason::RetryAfterTooLong
                ),
            stored_response: stop == StopReason::StoredResponse,
            last_class: self.outcomes.iter().last().map(|r| r.class),
            hedges: hedging.hedges,
            hedge_won: hedging.won_by.is_some_and(|n| n > 1),
            superseded: hedging.superseded,
            grpc: self.is_grpc().then(|| self.grpc_call(hedging)),
        };
        metrics.ended(&self.target, self.verdict.source(), ended);
    }

    /// A gRPC call's resends, from its attempts' outcomes: every attempt but the last was followed by a
    /// resend, transparent when it was not sent; the hedges are not retries.
    fn grpc_call(&self, hedging: super::HedgeSummary) -> crate::metrics::client::GrpcCall {
        let sent = self.outcomes.len() + hedging.superseded;
        let resends = sent.saturating_sub(1).saturating_sub(hedging.hedges);
        let before_last = self
            .outcomes
            .iter()
            .take(self.outcomes.len().saturating_sub(1) as usize);
        let not_sent = before_last
            .filter(|r| r.class == crate::classify::FailureClass::NotSent)
            .count() as u32;
        let transparent_retries = not_sent.min(resends);
        crate::metrics::client::GrpcCall {
            retries: resends - transparent_retries,
            transparent_retries,
            delay: self.outcomes.iter().filter_map(|r| r.delay).sum(),
        }
    }
}
