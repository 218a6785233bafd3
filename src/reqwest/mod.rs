//! The reqwest-middleware adapter: the same [`RetryPolicy`] in any reqwest-middleware stack.

mod body;
mod hedged;
mod lookup;
mod redirect;

use std::time::Duration;

use http::Extensions;
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};
use tracing::Instrument;

use crate::attempt_clock::{timed, AttemptClock};
use crate::attempts::Error;
use crate::attempts::{Attempts, CarriesReport, Outcome, Plan, Step};
use crate::box_error::BoxError;
use crate::policy::RetryPolicy;
use crate::service::kept::{keep_stream, Kept};
use crate::service::{AttemptNumber, KeyHeader, LayerAttempt, NotReplayable};
use crate::target::Target;
use crate::timed_out::TimedOut;

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
/// A deadline handed on ([`send_deadline_to`](crate::RetryPolicyBuilder::send_deadline_to))
/// is bounded by a request's own `timeout` (`RequestBuilder::timeout`); a timeout set on the
/// `Client` is not visible to a middleware: give the policy an
/// [`attempt_timeout`](crate::RetryPolicyBuilder::attempt_timeout) no longer than it.
///
/// # Hedging
///
/// With [`RetryPolicyBuilder::hedge`](crate::RetryPolicyBuilder::hedge), a slow request that
/// a repeat cannot harm gets backup attempts as in the tower layer (see
/// [`Hedge`](crate::hedge::Hedge)). Each attempt runs through its own clone of the rest of the chain
/// with a copy of the request's extensions; the winner's extensions become the caller's. A
/// request whose body is a stream is not hedged.
///
/// # Markers
///
/// Put [`Idempotency`](crate::classify::Idempotency) or [`NoRetry`](crate::classify::NoRetry) in the request with
/// `RequestBuilder::with_extension(..)`; route rules and method defaults apply as in the layer.
///
/// # Errors
///
/// Returns `reqwest_middleware::Error::Middleware` wrapping a [`tower_retry_safety::Error`](Error)
/// when the last attempt ended in an error: [`Error::from_reqwest_middleware`] finds it, and
/// [`RetryReport::of_reqwest`](crate::attempts::RetryReport::of_reqwest) reads a response's report.
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
///         Some(e) if e.may_have_been_applied() => eprintln!("may have been applied: {e}"),
///         _ => eprintln!("{err}"),
///     },
/// }
/// # }
/// ```
///
/// A streaming body (`Body::wrap_stream`, `Body::wrap`: `Request::try_clone()` gives `None`) is
/// recorded as it streams, up to the policy's
/// [`replay_buffer`](crate::RetryPolicyBuilder::replay_buffer), and a retry replays it (see
/// [`Replayable`](crate::service::Replayable)): the adapter hands reqwest each attempt's body through
/// `reqwest::Body::wrap`. A larger stream is sent exactly once, never refused before sending;
/// the report says [`StopReason::BodyNotReplayable`](crate::policy::StopReason::BodyNotReplayable) and
/// [`body_not_replayable`](crate::attempts::RetryReport::body_not_replayable) says why.
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
///
#[doc = include_str!("../docs/reqwest.md")]
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

    /// The redirect policy to build the `reqwest::Client` under this middleware with, when
    /// the policy hands deadlines on
    /// ([`send_deadline_to`](crate::RetryPolicyBuilder::send_deadline_to)). reqwest follows
    /// redirects below the middleware and copies every header of the request it redirects:
    /// the deadline headers would go on with a stale time left, perhaps to a host that never
    /// asked for them. This policy follows redirects as reqwest's default does (at most ten),
    /// except one from a host the policy sends its deadline to: that 3xx comes back to the
    /// caller, who follows it through the same client (each request then carries fresh
    /// values, and none to a host not named). A response that arrives from another URL than
    /// the one a deadline was sent to is logged as an error naming this setup.
    ///
    /// ```
    /// use reqwest_middleware::ClientBuilder;
    /// use tower_retry_safety::{RetryPolicy, RetrySafetyMiddleware};
    ///
    /// let policy = RetryPolicy::builder().send_deadline_to("api.internal").build()?;
    /// let middleware = RetrySafetyMiddleware::new(policy);
    /// let client = reqwest::Client::builder()
    ///     .redirect(middleware.redirect_policy())
    ///     .build()?;
    /// let client = ClientBuilder::new(client).with(middleware).build();
    /// # drop(client);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn redirect_policy(&self) -> reqwest::redirect::Policy {
        redirect::policy_for(&self.policy)
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
        let (mut attempts, kept) = start(policy, &mut req, extensions);
        if attempts.caller_gone() {
            let (result, reason) = attempts.refuse_at_caller_deadline::<Response>();
            return attempts
                .finish(result, reason)
                .map_err(reqwest_middleware::Error::middleware);
        }
        // One branch when the policy does not hedge.
        let hedge = match policy.hedging() {
            None => None,
            Some(_) => attempts.plan_hedge(
                || Some((req.url().host_str()?, req.url().port_or_known_default())),
                matches!(kept, Some(KeptRequest::Copy(_))),
            ),
        };
        if let (Some(delay), Some(KeptRequest::Copy(copy))) = (hedge, &kept) {
            attempts.next_attempt(req.headers_mut());
            if let Some(timeout) = req.timeout().copied() {
                attempts.cap_wire_wait(req.headers_mut(), timeout);
            }
            return hedged::run(&mut attempts, next, req, extensions, copy, delay).await;
        }
        loop {
            let result = send_attempt(&mut attempts, next.clone(), req, extensions).await;
            let resend = kept.as_ref().map(|k| k.check(result.is_ok()));
            let reason = match attempts.on_outcome(outcome(&result), resend) {
                Step::Wait(after) => {
                    drop(result);
                    tokio::time::sleep(after).await;
                    let kept = kept.as_ref().expect("a retry keeps its request");
                    match kept.next(attempts.body_wait()).await {
                        Ok(again) => {
                            req = again;
                            continue;
                        }
                        Err(why) => {
                            let err = attempts.finish_refused(why);
                            return Err(reqwest_middleware::Error::middleware(err));
                        }
                    }
                }
                Step::Stop(reason) => reason,
            };
            return attempts
                .finish(result.map_err(into_box), reason)
                .map_err(reqwest_middleware::Error::middleware);
        }
    }
}

/// Reads the request once (its verdict, a minted key, a copy kept for resends) and starts
/// its attempts.
fn start(
    policy: &RetryPolicy,
    req: &mut Request,
    extensions: &mut Extensions,
) -> (Attempts, Option<KeptRequest>) {
    let mut plan = Plan::new(
        policy,
        req.method(),
        || {
            use crate::classify::host::{unless_disagreeing, HostSeen};
            let (url, host) = (req.url(), req.headers().get(http::header::HOST));
            let Some(name) = url.host_str() else {
                return HostSeen::Nothing;
            };
            match unless_disagreeing(name, url.port_or_known_default(), host) {
                Some((name, port)) => HostSeen::Uri(name, port),
                None => HostSeen::Conflict,
            }
        },
        None,
        req.url().path(),
        req.headers(),
        extensions,
    );
    plan.mint_key(policy, req.headers_mut());
    let kept = if plan.may_retry(policy) {
        keep_request(req, policy.replay_buffer())
    } else {
        Err(NotReplayable::Stream)
    };
    let url = req.url();
    let target = Target::from_path(req.method().clone(), url.host_str(), url.path());
    let marks_attempts = plan.marks_attempts();
    let (kept, why_not) = match kept {
        Ok(kept) => (Some(kept), Ok(())),
        Err(why) => (None, Err(why)),
    };
    let attempts = Attempts::start(policy, plan, target, why_not);
    if marks_attempts {
        extensions.insert(LayerAttempt);
        KeyHeader::mark(policy, extensions);
    }
    (attempts, kept)
}

/// Sends the next attempt of `req` down the chain, with its number and (with a clock) the
/// attempt's clock in the extensions, cut by the policy's clock.
async fn send_attempt(
    attempts: &mut Attempts,
    next: Next<'_>,
    mut req: Request,
    extensions: &mut Extensions,
) -> reqwest_middleware::Result<Response> {
    let number = attempts.next_attempt(req.headers_mut());
    if let Some(timeout) = req.timeout().copied() {
        attempts.cap_wire_wait(req.headers_mut(), timeout);
    }
    if number > 1 {
        extensions.insert(AttemptNumber(number));
    }
    // With a clock, the attempt's clock, for a middleware that reads the body.
    let limit = attempts.sent_attempt_limit();
    let clock = limit.map(|_| attempts.clock());
    if let Some(clock) = &clock {
        extensions.insert(clock.clone());
    } else {
        extensions.remove::<AttemptClock>();
    }
    // A redirect the client follows below would carry the deadline on: said loudly.
    let sent = attempts.sends_deadline().then(|| req.url().clone());
    let attempt = next
        .run(req, extensions)
        .instrument(attempts.span().clone());
    let result = match limit {
        None => attempt.await,
        // Cut by the policy's clock: the attempt may have been sent.
        Some((limit, why)) => timed(attempt, limit, why, clock.as_ref(), || attempts.time_left())
            .await
            .unwrap_or_else(|why| Err(reqwest_middleware::Error::middleware(why))),
    };
    if let (Some(sent), Ok(res)) = (&sent, &result) {
        redirect::warn_if_followed(sent, res);
    }
    result
}

/// How an attempt ended, as the decision reads it.
fn outcome(result: &reqwest_middleware::Result<Response>) -> Outcome<'_> {
    match result {
        Ok(res) => Outcome::Response {
            status: res.status(),
            headers: res.headers(),
            extensions: res.extensions(),
        },
        Err(reqwest_middleware::Error::Reqwest(err)) => Outcome::Error(err),
        Err(reqwest_middleware::Error::Middleware(err)) => Outcome::Error(&**err),
    }
}

impl CarriesReport for Response {
    #[inline]
    fn extensions_mut(&mut self) -> &mut http::Extensions {
        Response::extensions_mut(self)
    }

    fn headers_mut(&mut self) -> &mut http::HeaderMap {
        Response::headers_mut(self)
    }
}

/// What the adapter keeps to send a request again.
enum KeptRequest {
    /// A copy of the request (`Request::try_clone`), copied again for each retry.
    Copy(Request),
    /// The request without its streaming body, and the body's recording.
    Recorded {
        parts: Request,
        body: Kept<reqwest::Body>,
    },
}

/// Keeps what a retry of `req` will need: a copy, or for a streaming body a recording of it
/// (then `req` is given the body that records the first attempt).
fn keep_request(req: &mut Request, limit: usize) -> Result<KeptRequest, NotReplayable> {
    if let Some(copy) = req.try_clone() {
        return Ok(KeptRequest::Copy(copy));
    }
    // Only a streaming body keeps a request from being cloned.
    let Some(body) = req.body_mut().take() else {
        return Err(NotReplayable::Stream);
    };
    let parts = req.try_clone();
    let (first, kept) = keep_stream(body, req.headers(), limit);
    *req.body_mut() = Some(first);
    match (parts, kept) {
        (Some(parts), Ok(body)) => Ok(KeptRequest::Recorded { parts, body }),
        (None, _) => Err(NotReplayable::Stream),
        (_, Err(why)) => Err(why),
    }
}

impl KeptRequest {
    fn check(&self, responded: bool) -> Result<(), NotReplayable> {
        match self {
            KeptRequest::Copy(_) => Ok(()),
            KeptRequest::Recorded { body, .. } => body.check(responded),
        }
    }

    /// The next attempt's request; for a recording, once the last attempt's transport has let
    /// go of it (waiting at most `wait`).
    async fn next(&self, wait: Duration) -> Result<Request, NotReplayable> {
        match self {
            KeptRequest::Copy(copy) => copy.try_clone().ok_or(NotReplayable::Stream),
            KeptRequest::Recorded { parts, body } => {
                let next = std::future::poll_fn(|cx| body.poll_next(cx));
                let body = tokio::time::timeout(wait, next)
                    .await
                    .unwrap_or(Err(NotReplayable::StillInUse))?;
                let mut again = parts.try_clone().ok_or(NotReplayable::Stream)?;
                *again.body_mut() = Some(body);
                Ok(again)
            }
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
