//! Per-call options: a request extension that overrides some of the policy's settings for
//! that request only.

use std::time::Duration;

use super::builder::MAX_RETRIES_LIMIT;

/// Settings for one request, overriding the policy's: put it in the request's extensions
/// (`req.extensions_mut().insert(..)`, or reqwest's `RequestBuilder::with_extension`).
///
/// The per-call form of OpenAI/Stainless SDKs' `with_options(max_retries=…, timeout=…)`.
/// `max_retries(0)` sends the request once, like [`NoRetry`](crate::classify::NoRetry), but the request's
/// attempts stay marked (an inner retry layer does not retry it either) and its report says
/// `RetriesExhausted` after a retryable failure.
///
/// ```
/// use std::time::Duration;
/// use tower_retry_safety::RequestOptions;
///
/// let mut req = http::Request::post("http://api.example.com/v1/tools/execute").body(())?;
/// req.extensions_mut().insert(
///     RequestOptions::new()
///         .max_retries(0)
///         .deadline(Duration::from_secs(30))
///         .attempt_timeout(Duration::from_secs(10)),
/// );
/// # Ok::<(), http::Error>(())
/// ```
///
/// With reqwest-middleware:
///
/// ```no_run
/// # #[cfg(feature = "reqwest-middleware")]
/// # async fn demo(client: reqwest_middleware::ClientWithMiddleware) -> reqwest_middleware::Result<()> {
/// use std::time::Duration;
/// use tower_retry_safety::RequestOptions;
///
/// let res = client
///     .get("http://api.example.com/v1/tools")
///     .with_extension(RequestOptions::new().max_retries(5).deadline(Duration::from_secs(20)))
///     .send()
///     .await?;
/// # drop(res);
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestOptions {
    pub(crate) max_retries: Option<u32>,
    pub(crate) deadline: Option<Duration>,
    pub(crate) attempt_timeout: Option<Duration>,
}

impl RequestOptions {
    /// Options that override nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Retries after the first attempt, for this request. Above 100 is taken as 100 (the
    /// policy's own limit).
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.max_retries = Some(retries.min(MAX_RETRIES_LIMIT));
        self
    }

    /// Total time for this request, counted from its first attempt: see
    /// [`RetryPolicyBuilder::deadline`](crate::RetryPolicyBuilder::deadline).
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Time for each attempt of this request: see
    /// [`RetryPolicyBuilder::attempt_timeout`](crate::RetryPolicyBuilder::attempt_timeout).
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = Some(timeout);
        self
    }
}
