//! One `tracing` span per attempt, with OpenTelemetry's HTTP client names and the crate's own
//! decisions. Without a subscriber that wants INFO spans, no span is made: one load of
//! tracing's global level, and `Attempts` keeps `None` (boxed when there is one, so a request
//! without spans moves one word, not a `Span`).

use http::StatusCode;
use tracing::field::Empty;
use tracing::Span;

use super::Attempts;
use crate::classify::{Classification, FailureClass, Idempotency};

/// The span of a request without one, for front ends to enter all the same.
static NO_SPAN: Span = Span::none();

impl Attempts {
    /// Opens attempt `number`'s span, which follows from the previous attempt's.
    #[inline]
    pub(super) fn open_span(&mut self, number: u32, hedge: bool) {
        if !tracing::level_enabled!(tracing::Level::INFO) {
            // Checked first: dropping `None` is a call the common case need not make.
            if self.span.is_some() {
                self.span = None;
            }
            return;
        }
        self.open_span_slow(number, hedge);
    }

    #[cold]
    fn open_span_slow(&mut self, number: u32, hedge: bool) {
        let span = tracing::info_span!(
            target: "tower_retry_safety::attempt",
            "HTTP attempt",
            otel.name = %self.target.method,
            otel.kind = "client",
            http.request.method = %self.target.method,
            url.path = self.target.path(),
            server.address = self.target.host(),
            http.request.resend_count = (number > 1).then_some(number - 1),
            http.response.status_code = Empty,
            error.r#type = Empty,
            retry_safety.attempt = number,
            retry_safety.idempotent = self.verdict.idempotency() == Idempotency::Idempotent,
            retry_safety.verdict_source = self.verdict.source().as_str(),
            retry_safety.keyed = self.verdict.is_keyed(),
            retry_safety.hedge = hedge,
            retry_safety.failure_class = Empty,
            retry_safety.decision = Empty,
            retry_safety.hedge_won = Empty,
            retry_safety.superseded = Empty,
        );
        if span.is_disabled() {
            self.span = None;
            return;
        }
        if let Some(previous) = &self.span {
            span.follows_from(&**previous);
        }
        self.span = Some(Box::new(span));
    }

    /// The current attempt's span: enter it while polling the attempt.
    #[inline]
    pub(crate) fn span(&self) -> &Span {
        self.span.as_deref().unwrap_or(&NO_SPAN)
    }

    /// Enters the current attempt's span, if there is one (guard it while calling or polling
    /// the attempt). Nothing to do without one: not even entering a disabled span.
    #[inline]
    pub(crate) fn enter_span(&self) -> Option<tracing::span::Entered<'_>> {
        self.span.as_deref().map(Span::enter)
    }

    /// Makes `span` the current one: while hedging, the span of the attempt whose outcome is
    /// decided next.
    #[inline]
    pub(crate) fn use_span(&mut self, span: Span) {
        self.span = (!span.is_disabled()).then(|| Box::new(span));
    }

    /// Writes an attempt's outcome and what was decided on its span.
    pub(super) fn record_span(
        &self,
        outcome: &Classification,
        status: Option<StatusCode>,
        decision: &str,
    ) {
        let Some(span) = &self.span else {
            return;
        };
        let class = outcome.class();
        span.record("retry_safety.failure_class", class.as_str());
        span.record("retry_safety.decision", decision);
        match status {
            Some(status) => {
                span.record("http.response.status_code", status.as_u16());
                if status.as_u16() >= 400 {
                    span.record("error.type", status.as_str());
                }
            }
            // An error, named by what it means for the request.
            None if class != FailureClass::Final || outcome.is_stored_response() => {
                span.record("error.type", class.as_str());
            }
            None => {
                span.record("error.type", "final");
            }
        }
    }
}

/// Marks the span of an attempt that lost: dropped while in flight.
pub(crate) fn superseded(span: &Span) {
    span.record("retry_safety.superseded", true);
}

/// Marks the span of the attempt whose response was returned, when hedges were sent.
pub(crate) fn won(span: &Span) {
    span.record("retry_safety.hedge_won", true);
}
