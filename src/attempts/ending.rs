//! How a request's bookkeeping ends: the report the caller gets, or the error around the last
//! attempt's failure.

use super::Attempts;
use super::Error;
use super::RetryReport;
use crate::classify::{FailureClass, Symptom};
use crate::policy::StopReason;
use crate::BoxError;

impl Attempts {
    /// The report, its parts taken out of `self`, which is spent afterwards.
    #[inline]
    pub(crate) fn take_report(&mut self, stop: StopReason) -> RetryReport {
        RetryReport {
            verdict: self.verdict,
            records: std::mem::take(&mut self.records),
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
        let class = self
            .records
            .iter()
            .last()
            .map_or(FailureClass::Ambiguous, |r| r.class);
        let symptom = Symptom::of(&*source);
        let target = self.target.clone();
        let report = self.take_report(stop);
        // Ambiguous: any response but proof that nothing was applied, or a failure after the
        // request may have been sent. The report adds whether the request can apply anything.
        let maybe_applied = report.reached_the_server();
        Error::after_attempts(target, report, class, maybe_applied, symptom, source)
    }
}
