//! The one error type of the layer and the adapter.

use std::error::Error as StdError;
use std::fmt;
use std::time::SystemTime;

use http::Method;

use super::{NotReplayable, RetryReport};
use crate::box_error::BoxError;
use crate::classify::Symptom;
use crate::classify::{FailureClass, Idempotency};
use crate::policy::StopReason;
use crate::target::Target;

/// A request that ended in an error after the retries this policy allows.
///
/// Opaque, with predicates, in the way of hyper-util's client error:
/// [`may_have_been_applied`] says whether the write may have happened, [`is_ambiguous`]
/// whether an attempt may have reached the server at all (for any request, a read too),
/// [`attempts`] how often it was sent, and
/// [`source`](StdError::source) leads down to the transport error. `Display` says what
/// happened and what to do next; it names the method and path, never the query string, a
/// header value or a body byte.
///
/// A request whose retries ended on a *response* (exhausted, suppressed, refused by the budget)
/// is not an error: the response is returned with its [`RetryReport`].
///
/// ```
/// # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// use std::{io, time::Duration};
/// use tower::{service_fn, Layer, ServiceExt};
/// use tower_retry_safety::{Error, RetryPolicy, StopReason};
///
/// let client = service_fn(|_req: http::Request<String>| async {
///     // The connection was reset after the request was written.
///     Err::<http::Response<String>, _>(io::Error::from(io::ErrorKind::ConnectionReset))
/// });
/// let svc = RetryPolicy::builder().build()?.layer(client);
/// let req = http::Request::post("/v1/tools/execute/GMAIL_SEND_EMAIL?token=secret")
///     .body(String::from("{}"))?;
/// let err: Error = svc.oneshot(req).await.unwrap_err();
///
/// assert!(err.may_have_been_applied()); // the email may have been sent
/// assert!(err.is_ambiguous()); // the attempt may have reached the server
/// assert!(err.retry_suppressed());
/// assert_eq!(err.attempts(), 1);
/// assert_eq!(err.stop_reason(), StopReason::SuppressedNotIdempotent);
/// assert!(err.to_string().starts_with(
///     "POST /v1/tools/execute/GMAIL_SEND_EMAIL was not retried: it is not idempotent"
/// ));
/// assert!(!err.to_string().contains("secret"));
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
///
/// [`may_have_been_applied`]: Error::may_have_been_applied
/// [`is_ambiguous`]: Error::is_ambiguous
/// [`attempts`]: Error::attempts
pub struct Error {
    inner: Box<ErrorImpl>,
}

struct ErrorImpl {
    kind: Kind,
    source: Option<BoxError>,
}

// The whole `ErrorImpl` is boxed once, so the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Kind {
    /// The inner service failed in `poll_ready`, before any request was handed to the layer.
    NotReady,
    /// One or more attempts were made; the last ended in `source`.
    Attempts {
        target: Target,
        report: RetryReport,
        class: FailureClass,
        maybe_applied: bool,
        symptom: Symptom,
    },
}

impl Error {
    pub(crate) fn not_ready(source: BoxError) -> Self {
        Error {
            inner: Box::new(ErrorImpl {
                kind: Kind::NotReady,
                source: Some(source),
            }),
        }
    }

    pub(crate) fn after_attempts(
        target: Target,
        report: RetryReport,
        class: FailureClass,
        maybe_applied: bool,
        symptom: Symptom,
        source: BoxError,
    ) -> Self {
        Error {
            inner: Box::new(ErrorImpl {
                kind: Kind::Attempts {
                    target,
                    report,
                    class,
                    maybe_applied,
                    symptom,
                },
                source: Some(source),
            }),
        }
    }

    /// The wrapped cause, or the error itself when it has none.
    pub(crate) fn into_source(self) -> Result<BoxError, Error> {
        let mut inner = self.inner;
        match inner.source.take() {
            Some(source) => Ok(source),
            None => Err(Error { inner }),
        }
    }

    fn report_ref(&self) -> Option<&RetryReport> {
        match &self.inner.kind {
            Kind::Attempts { report, .. } => Some(report),
            Kind::NotReady => None,
        }
    }

    /// True when the request may have been applied by the server: it can change the server's
    /// state (anything but a read: see [`RequestVerdict::can_apply`](crate::classify::RequestVerdict::can_apply))
    /// and [`is_ambiguous`](Self::is_ambiguous). Check the resource's state before retrying
    /// it by hand (an SDK that runs tools would check its execution log, or the provider's
    /// state). A GET that timed out is ambiguous but applied nothing: `false`.
    pub fn may_have_been_applied(&self) -> bool {
        self.is_ambiguous()
            && self
                .report_ref()
                .is_none_or(|report| report.verdict().can_apply())
    }

    /// True when an attempt may have reached the server's application: it was sent and its
    /// outcome is unknown, or the server answered. This describes the failure, whatever the
    /// request: a read too (a GET that timed out is ambiguous, and applied nothing). Whether a
    /// *write* may have happened is [`may_have_been_applied`](Self::may_have_been_applied);
    /// the opposite is [`is_not_sent`](Self::is_not_sent).
    pub fn is_ambiguous(&self) -> bool {
        matches!(
            self.inner.kind,
            Kind::Attempts {
                maybe_applied: true,
                ..
            }
        )
    }

    /// True when no attempt reached the server: sending the request again cannot repeat a side
    /// effect.
    pub fn is_not_sent(&self) -> bool {
        !self.is_ambiguous()
    }

    /// True when the last attempt timed out (a tower `timeout`, a client timeout).
    pub fn is_timeout(&self) -> bool {
        matches!(
            self.inner.kind,
            Kind::Attempts {
                symptom: Symptom::Timeout,
                ..
            }
        )
    }

    /// True when a retry was withheld because the request is not idempotent and may have been
    /// applied.
    pub fn retry_suppressed(&self) -> bool {
        self.stop_reason() == StopReason::SuppressedNotIdempotent
    }

    /// True when the request carried a well-formed idempotency key that the policy does not
    /// trust its target to honour, so the key did not make a retry safe (see
    /// [`RetryReport::idempotency_key_untrusted`]). `Display` says so when it mattered: when
    /// the request was not retried because it is a write.
    pub fn idempotency_key_untrusted(&self) -> bool {
        self.report_ref()
            .is_some_and(RetryReport::idempotency_key_untrusted)
    }

    /// How many attempts were made (0 when the inner service failed before any).
    pub fn attempts(&self) -> u32 {
        self.report_ref().map_or(0, RetryReport::attempts)
    }

    /// Why there was no further attempt.
    pub fn stop_reason(&self) -> StopReason {
        self.report_ref()
            .map_or(StopReason::ServiceNotReady, RetryReport::stop_reason)
    }

    /// The class of the last attempt's failure.
    pub fn failure_class(&self) -> Option<FailureClass> {
        match &self.inner.kind {
            Kind::Attempts { class, .. } => Some(*class),
            Kind::NotReady => None,
        }
    }

    /// The full report: verdict, each attempt, the stop reason.
    pub fn report(&self) -> Option<&RetryReport> {
        self.report_ref()
    }

    /// The request id from the policy's request-id header, if the request carried one.
    pub fn request_id(&self) -> Option<&str> {
        self.report_ref().and_then(RetryReport::request_id)
    }

    /// The idempotency key the request carried: reuse it for a retry by hand, so the server
    /// can recognise a repeat.
    pub fn idempotency_key(&self) -> Option<&str> {
        self.report_ref().and_then(RetryReport::idempotency_key)
    }

    /// When the first attempt started.
    pub fn first_attempt_at(&self) -> Option<SystemTime> {
        self.report_ref().map(RetryReport::first_attempt_at)
    }

    /// When the last attempt started.
    pub fn last_attempt_at(&self) -> Option<SystemTime> {
        self.report_ref().map(RetryReport::last_attempt_at)
    }

    /// The request method.
    pub fn method(&self) -> Option<&Method> {
        match &self.inner.kind {
            Kind::Attempts { target, .. } => Some(&target.method),
            Kind::NotReady => None,
        }
    }

    /// The request path, without the query string, capped at 256 bytes.
    pub fn path(&self) -> Option<&str> {
        match &self.inner.kind {
            Kind::Attempts { target, .. } => Some(target.path()),
            Kind::NotReady => None,
        }
    }

    /// The version of this crate, for bug reports.
    pub fn crate_version(&self) -> &'static str {
        env!("CARGO_PKG_VERSION")
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("tower_retry_safety::Error");
        if let Kind::Attempts {
            target,
            class,
            maybe_applied,
            ..
        } = &self.inner.kind
        {
            d.field("method", &target.method)
                .field("path", &target.path())
                .field("attempts", &self.attempts())
                .field("stop", &self.stop_reason())
                .field("class", class)
                .field("ambiguous", maybe_applied)
                .field("request_id", &self.request_id())
                .field("idempotency_key", &self.idempotency_key())
                .field(
                    "idempotency_key_untrusted",
                    &self.idempotency_key_untrusted(),
                );
        } else {
            d.field("stop", &self.stop_reason());
        }
        d.field("source", &self.inner.source).finish()
    }
}

const UNTRUSTED_KEY: &str = " It carried an idempotency key that is not trusted for this target, \
so the key did not make a retry safe; see `honor_idempotency_key_for_host`.";

const CHECK_FIRST: &str = "Check the resource's state on the server before retrying it by hand.";

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Kind::Attempts {
            target,
            report,
            class,
            maybe_applied,
            symptom,
        } = &self.inner.kind
        else {
            return f.write_str(
                "the inner service failed while getting ready; no request was handed to it",
            );
        };
        let attempts = report.attempts();
        let what = match (class, symptom) {
            (FailureClass::NotSent, _) => "never reached the server",
            (FailureClass::Final, _) => "failed with an error that retrying cannot fix",
            (_, Symptom::Timeout) => "timed out after it was sent",
            (_, Symptom::ConnectionLost) => "lost its connection after it was sent",
            (_, Symptom::Other) => "failed after it may have been sent",
        };
        // A read applies nothing, so repeating it is harmless, whatever stopped the retries (a
        // `NoRetry` read's verdict is non-idempotent, the cautious case, yet applies nothing).
        let idempotent = report.verdict().idempotency() == Idempotency::Idempotent
            || !report.verdict().can_apply();
        let untrusted_key =
            report.idempotency_key_untrusted() && !report.verdict().repeat_is_harmless();
        match report.stop_reason() {
            StopReason::CallerDeadline if attempts == 0 => write!(
                f,
                "{target} was not sent: its caller's deadline had passed, so nothing was applied"
            )?,
            StopReason::SuppressedNotIdempotent => write!(
                f,
                "{target} was not retried: it is not idempotent and the attempt {what}, \
                 so it may have been applied. {CHECK_FIRST}"
            )?,
            StopReason::NoRetryMarker => {
                write!(f, "{target} failed on its only attempt (it is marked NoRetry): the attempt {what}")?;
                advice(f, *class, *maybe_applied, idempotent)?
            }
            StopReason::BodyNotReplayable => {
                let why = report
                    .body_not_replayable()
                    .unwrap_or(NotReplayable::Stream);
                write!(f, "{target} was not retried: {why}, and the attempt {what}")?;
                advice(f, *class, *maybe_applied, idempotent)?
            }
            reason => {
                let why = match reason {
                    StopReason::RetriesExhausted => "no retries were left",
                    StopReason::Budget => "the retry budget is spent (too many retries lately)",
                    StopReason::Deadline => "the next attempt could not start before the deadline",
                    StopReason::CallerDeadline => {
                        "no attempt could start before the caller's deadline"
                    }
                    StopReason::RetriedByOuterLayer => "an outer retry layer decides about retries",
                    StopReason::ServiceNotReady => {
                        "the inner service failed while getting ready for the next attempt"
                    }
                    _ => "the error is final",
                };
                let plural = if attempts == 1 { "" } else { "s" };
                write!(f, "{target} failed after {attempts} attempt{plural} ({why}): the last attempt {what}")?;
                advice(f, *class, *maybe_applied, idempotent)?
            }
        }
        if untrusted_key {
            f.write_str(UNTRUSTED_KEY)?;
        }
        Ok(())
    }
}

fn advice(
    f: &mut fmt::Formatter<'_>,
    class: FailureClass,
    maybe_applied: bool,
    idempotent: bool,
) -> fmt::Result {
    match (maybe_applied, idempotent) {
        (false, _) if class == FailureClass::Final => {
            f.write_str(". It was never sent; fix the request before sending it again.")
        }
        (false, _) => f.write_str(". It was never applied, so it is safe to send again."),
        (true, true) => f.write_str(". Repeating it is harmless."),
        (true, false) => write!(f, ", so it may have been applied. {CHECK_FIRST}"),
    }
}

/// "May this request have been applied?", asked of any error (or report) a request ends
/// in, and always answered: `false` only when it is known that no attempt reached the server's
/// application; `true` when one may have, and when nothing says (an error this crate cannot
/// see into is never taken to mean that a write did not happen).
///
/// `false` for a read (a safe method that no marker or rule calls a write: it applies
/// nothing), however its attempts failed.
///
/// Implemented for this crate's [`struct@Error`] ([`may_have_been_applied`](Error::may_have_been_applied)), for
/// [`RetryReport`] ([`may_have_been_applied`](RetryReport::may_have_been_applied)), and with
/// the `reqwest-middleware` feature for `reqwest_middleware::Error`: this crate's error
/// inside it answers; a `reqwest::Error` (a client without the middleware) is classified
/// like any attempt's error; any other middleware error is ambiguous (say an outer middleware
/// failed after the request was sent).
///
/// ```
/// use tower_retry_safety::{Error, MayHaveBeenApplied};
///
/// fn tell_the_caller(err: &impl MayHaveBeenApplied) -> &'static str {
///     if err.may_have_been_applied() {
///         "the write may have happened: check before sending it again"
///     } else {
///         "nothing was applied: safe to send again"
///     }
/// }
/// # let _ = |e: &Error| tell_the_caller(e);
/// ```
pub trait MayHaveBeenApplied {
    /// `false` only when no attempt can have reached the server's application.
    fn may_have_been_applied(&self) -> bool;
}

impl MayHaveBeenApplied for Error {
    fn may_have_been_applied(&self) -> bool {
        Error::may_have_been_applied(self)
    }
}

impl MayHaveBeenApplied for RetryReport {
    fn may_have_been_applied(&self) -> bool {
        RetryReport::may_have_been_applied(self)
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.inner
            .source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}
