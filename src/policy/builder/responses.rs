//! What a response says: statuses worth repeating, statuses that prove nothing was applied,
//! the caller's classifiers, and the attempt hook.

use super::*;

impl RetryPolicyBuilder {
    /// The response statuses that are transient.
    ///
    /// Defaults to 408, 429, 500, 502, 503 and 504. Success (2xx) statuses are refused.
    pub fn retry_statuses(mut self, statuses: impl IntoIterator<Item = StatusCode>) -> Self {
        self.responses.retry_statuses = statuses.into_iter().collect();
        self
    }

    /// Statuses this API returns only before it applies anything — a rate limiter's 429 in
    /// front of the handler, a documented "not processed" error: a response with one is proof
    /// that nothing was applied, classified [`NotSent`](crate::classify::FailureClass::NotSent), so a
    /// write is retried on it too (honouring `Retry-After`), as after a refused connection.
    /// Name only statuses you know to be such proof: a write retried on one that was not is
    /// applied twice.
    ///
    /// Defaults to none. Success (2xx) statuses are refused.
    pub fn not_applied_statuses(mut self, statuses: impl IntoIterator<Item = StatusCode>) -> Self {
        self.responses.not_applied_statuses = statuses.into_iter().collect();
        self
    }

    /// A hook that knows the API: it sees each response's status and headers before the
    /// policy's own rules and may classify it — `Some(FailureClass::NotSent)` for a response
    /// that proves nothing was applied (a write is retried on it), `Some(RetryableResponse)`
    /// for one worth repeating (only an idempotent or keyed request is), `Some(Final)` to stop;
    /// `None` leaves the response to the policy. (`Ambiguous` counts as `RetryableResponse`.)
    /// It can never make a write that may have been applied retryable except by declaring
    /// that proof, which is the hook's to be sure of. Errors are not passed to it: an error's
    /// class is decided from its source chain.
    ///
    /// ```
    /// use tower_retry_safety::{FailureClass, RetryPolicy};
    ///
    /// let policy = RetryPolicy::builder()
    ///     .classify_responses_with(|status, headers| {
    ///         // This API marks requests its queue refused before running them.
    ///         (status == 409 && headers.get("x-not-processed").is_some())
    ///             .then_some(FailureClass::NotSent)
    ///     })
    ///     .build()?;
    /// # drop(policy);
    /// # Ok::<(), tower_retry_safety::BuildError>(())
    /// ```
    ///
    /// Defaults to none.
    pub fn classify_responses_with(
        mut self,
        hook: impl Fn(StatusCode, &HeaderMap) -> Option<FailureClass> + Send + Sync + 'static,
    ) -> Self {
        self.responses.response_hook = Some(ResponseHook(Arc::new(hook)));
        self
    }

    /// Calls `hook` after every attempt with what happened and what was decided: count
    /// attempts, retries by class, suppressed writes, budget and deadline refusals, bodies that
    /// could not be replayed — and export them to your metrics. It runs on the request's task:
    /// keep it cheap (increment a counter).
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use std::sync::Arc;
    /// use tower_retry_safety::policy::Decision;
    /// use tower_retry_safety::{RetryPolicy, StopReason};
    ///
    /// let suppressed = Arc::new(AtomicU64::new(0));
    /// let counter = suppressed.clone();
    /// let policy = RetryPolicy::builder()
    ///     .on_attempt(move |event| {
    ///         if event.decision == Decision::Stop(StopReason::SuppressedNotIdempotent) {
    ///             counter.fetch_add(1, Ordering::Relaxed);
    ///         }
    ///     })
    ///     .build()?;
    /// # drop(policy);
    /// # Ok::<(), tower_retry_safety::BuildError>(())
    /// ```
    ///
    /// Defaults to none.
    pub fn on_attempt(mut self, hook: impl Fn(&AttemptEvent<'_>) + Send + Sync + 'static) -> Self {
        self.responses.on_attempt = Some(AttemptHook(Arc::new(hook)));
        self
    }
}
