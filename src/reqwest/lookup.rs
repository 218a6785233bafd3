//! One call to reach this crate's error and report through reqwest-middleware's types.

use crate::attempts::Error;
use crate::attempts::MayHaveBeenApplied;
use crate::attempts::RetryReport;
use crate::classify::{classify_error, FailureClass};

/// Always answers: this crate's error inside answers for itself; a bare `reqwest::Error` (a
/// client without [`RetrySafetyMiddleware`](crate::reqwest::RetrySafetyMiddleware)) is classified as
/// an attempt's error is (a connect failure was not sent, a timeout may have been applied);
/// any other middleware's error is ambiguous, since it may have failed after sending.
///
/// ```no_run
/// # async fn demo(client: reqwest_middleware::ClientWithMiddleware) {
/// use tower_retry_safety::MayHaveBeenApplied;
///
/// if let Err(err) = client.post("http://127.0.0.1:8080/v1/messages").send().await {
///     if err.may_have_been_applied() {
///         eprintln!("check the outbox before sending again: {err}");
///     }
/// }
/// # }
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest-middleware")))]
impl MayHaveBeenApplied for reqwest_middleware::Error {
    fn may_have_been_applied(&self) -> bool {
        if let Some(ours) = Error::from_reqwest_middleware(self) {
            return ours.may_have_been_applied();
        }
        match self {
            reqwest_middleware::Error::Reqwest(err) => !matches!(
                classify_error(err),
                FailureClass::NotSent | FailureClass::Final
            ),
            reqwest_middleware::Error::Middleware(_) => true,
        }
    }
}

impl Error {
    /// This crate's error inside a `reqwest_middleware::Error`, if it is one.
    ///
    /// [`RetrySafetyMiddleware`](crate::reqwest::RetrySafetyMiddleware) returns its errors as
    /// `reqwest_middleware::Error::Middleware`; this finds ours there, also behind context a
    /// middleware further out added with anyhow. `None` for an error our middleware did not
    /// make (a `reqwest_middleware::Error::Reqwest` comes from a client without it).
    ///
    /// ```no_run
    /// # async fn demo(client: reqwest_middleware::ClientWithMiddleware) {
    /// use tower_retry_safety::Error;
    ///
    /// if let Err(err) = client.post("http://127.0.0.1:8080/v1/messages").send().await {
    ///     match Error::from_reqwest_middleware(&err) {
    ///         Some(e) if e.may_have_been_applied() => eprintln!("may have been applied: {e}"),
    ///         Some(e) => eprintln!("not applied: {e}"),
    ///         None => eprintln!("{err}"),
    ///     }
    /// }
    /// # }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "reqwest-middleware")))]
    pub fn from_reqwest_middleware(err: &reqwest_middleware::Error) -> Option<&Error> {
        match err {
            reqwest_middleware::Error::Middleware(e) => {
                e.chain().find_map(|cause| cause.downcast_ref::<Error>())
            }
            reqwest_middleware::Error::Reqwest(_) => None,
        }
    }
}

impl RetryReport {
    /// The report [`RetrySafetyMiddleware`](crate::reqwest::RetrySafetyMiddleware) put in a reqwest
    /// response's extensions; `None` when the response did not come through it.
    ///
    /// ```no_run
    /// # async fn demo(client: reqwest_middleware::ClientWithMiddleware) -> reqwest_middleware::Result<()> {
    /// use tower_retry_safety::RetryReport;
    ///
    /// let res = client.get("http://127.0.0.1:8080/v1/report").send().await?;
    /// if let Some(report) = RetryReport::of_reqwest(&res) {
    ///     println!("{} attempt(s), stopped: {:?}", report.attempts(), report.stop_reason());
    /// }
    /// # Ok(()) }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "reqwest-middleware")))]
    pub fn of_reqwest(res: &reqwest::Response) -> Option<&RetryReport> {
        res.extensions().get()
    }
}
