//! The reqwest-middleware adapter: the same [`RetryPolicy`] in any reqwest-middleware stack.

mod body;
mod lookup;

use http::Extensions;
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};

use crate::attempts::{Attempts, Plan, Target};
use crate::policy::{Decision, StopReason};
use crate::service::LayerAttempt;
use crate::timed_out::TimedOut;
use crate::{BoxError, Error, RetryPolicy};

/// Retries requests in a reqwest-middleware chain as the [`RetryPolicy`] allows: the same
/// decisions, from the same code, as the tower layer. One policy value can serve a tower stack
/// and a reqwest stack at once; its clones share the retry budget.
///
/// # Where it goes
///
/// Add it first (outermost) among middlewares that should run once per logical request
/// (tracing spans, auth refresh that must not be repeated), and after those that must run on
/// every attempt: every middleware added after it runs once per attempt. reqwest's own
/// `timeout` (on the `Client` or the `RequestBuilder`) applies to each attempt: an attempt
/// that times out after connecting is ambiguous, one that times out while connecting is not
/// sent. Turn off reqwest's built-in retries if you enable them, so they do not compound.
///
/// # Markers
///
/// Put [`Idempotency`](crate::Idempotency) or [`NoRetry`](crate::NoRetry) in the request with
/// `RequestBuilder::with_extension(..)`; route rules and method defaults apply as in the layer.
///
/// # Errors
///
/// Returns `reqwest_middleware::Error::Middleware` wrapping a [`tower_retry_safety::Error`](Error)
/// when the last attempt ended in an error: [`Error::from_reqwest_middleware`] finds it, and
/// [`RetryReport::of_reqwest`](crate::RetryReport::of_reqwest) reads a response's report.
///
/// ```no_run
/// # async fn demo(client: reqwest_middleware::ClientWithMiddleware) {
/// use tower_retry_safety::{Error, RetryReport};
///
/// match client.post("http://127.0.0.1:8080/v1/messages").send().await {
///     Ok(res) => {
///         let attempts = RetryReport::of_reqwest(&res).map(RetryReport::attempts);
///         println!("{} after {attempts:?} attempt(s)", res.status());
///     }
///     Err(err) => match Error::from_reqwest_middleware(&err) {
///         Some(e) if e.is_ambiguous() => eprintln!("may have been applied: {e}"),
///         _ => eprintln!("{err}"),
///     },
/// }
/// # }
/// ```
///
/// Streaming bodies (`Request::try_clone()` gives `None`) are sent exactly once, never refused
/// before sending; the report says [`StopReason::BodyNotReplayable`].
///
/// ```
/// use reqwest_middleware::ClientBuilder;
/// use tower_retry_safety::{RetryPolicy, RetrySafetyMiddleware};
///
/// let policy = RetryPolicy::builder().build()?;
/// let client = ClientBuilder::new(reqwest::Client::new())
///     .with(RetrySafetyMiddleware::new(policy))
///     .build();
/// # drop(client);
/// # Ok::<(), tower_retry_safety::BuildError>(())
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest-middleware")))]
#[derive(Clone, Debug)]
pub struct RetrySafetyMiddleware {
    policy: RetryPolicy,
}

impl RetrySafetyMiddleware {
    /// A middleware driven by `policy`.
    pub fn new(policy: RetryPolicy) -> Self {
        RetrySafetyMiddleware { policy }
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }
}

#[async_trait::async_trait]
impl Middleware for RetrySafetyMiddleware {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let policy = &self.policy;
        let mut req = req;
        let mut plan = Plan::new(
            policy,
            req.method(),
            || req.url().host_str(),
            req.url().path(),
            req.headers(),
            extensions,
        );
        plan.mint_key(policy, req.headers_mut());
        let copy = if plan.may_retry(policy) {
            req.try_clone()
        } else {
            None
        };
        let target = Target::from_path(req.method().clone(), req.url().path());
        let marks_attempts = plan.marks_attempts();
        let mut attempts = Attempts::start(policy, plan, target, copy.is_some());
        if marks_attempts {
            extensions.insert(LayerAttempt);
        }
        loop {
            attempts.next_attempt(req.headers_mut());
            let attempt = next.clone().run(req, extensions);
            let result = match attempts.attempt_limit() {
                None => attempt.await,
                // Cut by the policy's clock: the attempt may have been sent.
                Some((limit, why)) => tokio::time::timeout(limit, attempt)
                    .await
                    .unwrap_or_else(|_| Err(reqwest_middleware::Error::middleware(why))),
            };
            let decision = match &result {
                Ok(res) => attempts.on_response(res.status(), res.headers()),
                Err(reqwest_middleware::Error::Reqwest(err)) => attempts.on_error(err),
                Err(reqwest_middleware::Error::Middleware(err)) => attempts.on_error(&**err),
            };
            let reason = match decision {
                Decision::Retry { after } => match copy.as_ref().and_then(Request::try_clone) {
                    Some(again) => {
                        drop(result);
                        tokio::time::sleep(after).await;
                        req = again;
                        continue;
                    }
                    None => StopReason::BodyNotReplayable,
                },
                Decision::Stop(reason) => reason,
            };
            return match result {
                Ok(mut res) => {
                    if reason != StopReason::RetriedByOuterLayer {
                        res.extensions_mut().insert(attempts.into_report(reason));
                    }
                    Ok(res)
                }
                Err(err) => Err(reqwest_middleware::Error::middleware(
                    attempts.into_error(reason, into_box(err)),
                )),
            };
        }
    }
}

/// The transport error without reqwest-middleware's transparent wrapper; an error of this
/// crate from a middleware further in stays recognisable.
///
/// A `reqwest::Error` prints its URL, query string included (`Display`, `Debug`, and so every
/// report of the chain that ours leads to): it is kept without it. An error of another
/// middleware's own type is kept as it is; it is that middleware's to keep secrets out of.
fn into_box(err: reqwest_middleware::Error) -> BoxError {
    match err {
        reqwest_middleware::Error::Reqwest(e) => Box::new(e.without_url()),
        reqwest_middleware::Error::Middleware(e) => match e.downcast::<Error>() {
            Ok(ours) => Box::new(ours),
            Err(other) => match other.downcast::<reqwest::Error>() {
                Ok(e) => Box::new(e.without_url()),
                // The adapter's own cut, kept as itself (not behind anyhow's wrapper) so the
                // error knows it timed out.
                Err(other) => match other.downcast::<TimedOut>() {
                    Ok(cut) => Box::new(cut),
                    Err(other) => other.into(),
                },
            },
        },
    }
}
