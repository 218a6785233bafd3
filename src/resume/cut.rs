use std::error::Error as StdError;
use std::fmt;

use http::StatusCode;

use crate::attempts::RetryReport;
use crate::box_error::BoxError;
use crate::timed_out::TimedOut;

/// The error a response body gives when it was cut before its end and could not be recovered:
/// the server had answered (with [`status`](Self::status), which the caller already has), and
/// only the rest of the body was lost. [`source`](StdError::source) is the transport's error.
///
/// The request was not sent again because of it when a repeat could repeat a write (a
/// non-idempotent request without a trusted idempotency key), or when the retry layer
/// refused (retries used up, the budget, the deadline: its [`RetryReport`](crate::attempts::RetryReport)
/// says which). It never holds any of the body's bytes, headers or URL.
///
/// ```
/// use std::error::Error as _;
/// use tower_retry_safety::resume::BodyCutError;
///
/// # fn check(err: &(dyn std::error::Error + 'static)) {
/// if let Some(cut) = err.downcast_ref::<BodyCutError>() {
///     eprintln!("{} answered, body lost after {} bytes", cut.status(), cut.bytes_received());
/// }
/// # }
/// ```
pub struct BodyCutError {
    status: StatusCode,
    received: u64,
    why_no_resume: Option<NoResume>,
    /// The report with the resumes, for a body that resumed past the limit.
    report: Option<Box<RetryReport>>,
    source: BoxError,
}

/// Why a body cut past the read-whole limit was not resumed with a `Range` request.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoResume {
    /// The request is not one whose repeat is harmless, or not a `GET`.
    NotRepeatable,
    /// The first response gave no strong validator (a strong `ETag`, or a `Last-Modified`
    /// without an `ETag`): a second response could not be proven to be the same
    /// representation.
    NoValidator,
    /// The server answered the range request with something other than a matching `206`
    /// (a `200` for the whole body, a changed representation, an unreadable `Content-Range`),
    /// or the first response was not a `200` (only a whole representation is resumed).
    NotTheSame,
    /// The retry layer refused another attempt (retries used up, the budget, the deadline),
    /// or there was no retry layer outside to decide.
    Refused,
    /// The front end was given nothing to send a range request with (reqwest:
    /// `ReadWholeMiddleware::resume_with`).
    NoSender,
}

impl NoResume {
    fn as_str(self) -> &'static str {
        match self {
            NoResume::NotRepeatable => "the request is not one whose repeat is harmless",
            NoResume::NoValidator => {
                "the response has no strong validator to prove a second one the same"
            }
            NoResume::NotTheSame => {
                "the server did not answer the range request with the same representation"
            }
            NoResume::Refused => "the retry policy refused another attempt",
            NoResume::NoSender => "no client was given to send a range request with",
        }
    }
}

impl BodyCutError {
    pub(crate) fn new(status: StatusCode, received: u64, source: BoxError) -> Self {
        BodyCutError {
            status,
            received,
            why_no_resume: None,
            report: None,
            source,
        }
    }

    pub(crate) fn with_report(mut self, report: Option<RetryReport>) -> Self {
        self.report = report.map(Box::new);
        self
    }

    pub(crate) fn no_resume(mut self, why: NoResume) -> Self {
        self.why_no_resume = Some(why);
        self
    }

    /// The status the server had answered with.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// How many bytes of the body arrived before the cut (the caller got them, or, for a body
    /// read inside the attempt, gets them in front of this error).
    pub fn bytes_received(&self) -> u64 {
        self.received
    }

    /// Whether the request's own deadline ended the body while it streamed (a cut of the
    /// client's making: the server may still have been sending).
    ///
    /// ```
    /// # fn check(cut: &tower_retry_safety::resume::BodyCutError) {
    /// if cut.is_deadline() {
    ///     eprintln!("give the download a longer deadline");
    /// }
    /// # }
    /// ```
    pub fn is_deadline(&self) -> bool {
        self.source.downcast_ref::<TimedOut>() == Some(&TimedOut::Deadline)
    }

    /// Why the rest of a body cut past the read-whole limit was not asked for with `Range`;
    /// `None` for a body read inside the attempt (the retry layer's report says why it was not
    /// read again).
    pub fn why_no_resume(&self) -> Option<NoResume> {
        self.why_no_resume
    }

    /// For a body cut past the read-whole limit once the retry layer had handed it its
    /// bookkeeping: the report of the request's attempts, its resumes included, whose stop
    /// reason says why no further resume was made (retries used up, the budget, the deadline).
    /// `None` for a body read inside the attempt: the response's report tells that story.
    ///
    /// ```
    /// # fn check(cut: &tower_retry_safety::resume::BodyCutError) {
    /// if let Some(report) = cut.report() {
    ///     eprintln!("{} attempt(s), stopped: {:?}", report.attempts(), report.stop_reason());
    /// }
    /// # }
    /// ```
    pub fn report(&self) -> Option<&RetryReport> {
        self.report.as_deref()
    }
}

impl fmt::Display for BodyCutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_deadline() {
            // The client's clock, not the server, ended it.
            write!(
                f,
                "response body cut after {} bytes by the request's deadline, while the server \
                 (which had answered {}) was still sending it",
                self.received, self.status
            )?;
        } else {
            write!(
                f,
                "response body cut after {} bytes: the server had answered {}, only the rest \
                 of the body was lost",
                self.received, self.status
            )?;
        }
        if let Some(why) = self.why_no_resume {
            write!(f, "; not resumed: {}", why.as_str())?;
        }
        Ok(())
    }
}

/// Says what the message says; never a byte of the body.
impl fmt::Debug for BodyCutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BodyCutError")
            .field("status", &self.status)
            .field("received", &self.received)
            .field("why_no_resume", &self.why_no_resume)
            .field("report", &self.report)
            .field("source", &self.source)
            .finish()
    }
}

impl StdError for BodyCutError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}
