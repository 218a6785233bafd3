//! The report of a body that resumes after the caller got the head: a handle in the response's
//! extensions, which a caller whose front end hides the body (reqwest) can still read.

use std::fmt;
use std::sync::{Arc, Mutex};

use crate::attempts::RetryReport;

/// The [`RetryReport`] of a response whose body may resume with `Range` past the read-whole
/// limit, with the body's resumes counted once a cut was decided on. Put in the response's
/// extensions by [`ReadWholeLayer`](crate::resume::ReadWholeLayer) and
/// [`ReadWholeMiddleware`](crate::resume::ReadWholeMiddleware) beside the response's own report, which
/// stops at the head. Clone it before reading a body that consumes the response (reqwest's
/// `bytes()`): the clone sees every later resume.
///
/// ```
/// use tower_retry_safety::resume::BodyReport;
///
/// # fn show<B>(res: &http::Response<B>) {
/// let body_report = BodyReport::of(res).cloned();
/// // … read the body …
/// if let Some(report) = body_report.and_then(|r| r.get()) {
///     println!("{} attempt(s), resumes included", report.attempts());
/// }
/// # }
/// ```
#[derive(Clone, Default)]
pub struct BodyReport(Arc<Mutex<Option<RetryReport>>>);

impl BodyReport {
    /// The handle in a response's extensions, if its body may resume.
    pub fn of<B>(res: &http::Response<B>) -> Option<&BodyReport> {
        res.extensions().get()
    }

    /// The handle in a reqwest response's extensions, if its body may resume.
    #[cfg(feature = "reqwest-middleware")]
    #[cfg_attr(docsrs, doc(cfg(feature = "reqwest-middleware")))]
    pub fn of_reqwest(res: &reqwest::Response) -> Option<&BodyReport> {
        res.extensions().get()
    }

    /// The report with the body's resumes, once its body was cut (each cut and each range
    /// request is an attempt in it; its stop reason says why the resumes stopped); `None`
    /// while the body was never cut: the response's own report is then the whole story.
    pub fn get(&self) -> Option<RetryReport> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn set(&self, report: RetryReport) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(report);
    }
}

/// Says whether a resume was decided; the report itself has its own `Debug`.
impl fmt::Debug for BodyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BodyReport").field(&self.get()).finish()
    }
}
