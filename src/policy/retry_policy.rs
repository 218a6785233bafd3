//! [`RetryPolicy`]: the settings and the decision, shared by the tower layer and the
//! reqwest-middleware adapter.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{Extensions, HeaderMap, HeaderName, HeaderValue, Method, Request, Response};
use tower::retry::budget::Budget;

use super::AttemptHook;
use super::{events, hops, host_routes, key_trust};
use crate::backoff::Backoff;
use crate::build_error::BuildError;
use crate::classify::host::{HostScope, HostSeen};
use crate::classify::request::is_safe_method;
use crate::classify::response::{self, ResponseRules};
use crate::classify::routes::RouteTable;
use crate::classify::{idempotency_key, Classification, Idempotency, NoRetry, RequestVerdict};
use crate::classify::{BodyVerdict, FailureClass, VerdictSource};

/// The retry-safety policy: which requests may be repeated, after which failures, how often
/// and how long to wait.
///
/// Build one with [`RetryPolicy::builder`]. It is also a [`tower::Layer`](https://docs.rs/tower/0.5/tower/trait.Layer.html) (see
/// [`RetrySafety`](crate::service::RetrySafety)).
///
/// # Clone
///
/// Cloning is cheap: the settings and the retry budget live behind one `Arc`, so every clone —
/// every layer, service and middleware made from it — shares the same budget.
///
/// ```
/// use tower_retry_safety::RetryPolicy;
///
/// let policy = RetryPolicy::builder().max_retries(3).build()?;
/// let for_reqwest = policy.clone(); // same budget
/// # drop(for_reqwest);
/// # Ok::<(), tower_retry_safety::BuildError>(())
/// ```
#[derive(Clone)]
pub struct RetryPolicy {
    pub(crate) inner: Arc<Inner>,
    /// The host (and port) of the service the layer wraps, for requests that show none: see
    /// [`for_origin`](RetryPolicy::for_origin).
    pub(crate) origin: Option<Arc<HostScope>>,
}

/// The idempotency key's header unless a policy names another.
pub(crate) const DEFAULT_KEY_HEADER: HeaderName = HeaderName::from_static("idempotency-key");

/// The headers a policy reads and writes.
#[derive(Clone, Debug)]
pub(crate) struct Headers {
    pub(crate) idempotency_key_header: HeaderName,
    /// Whether `idempotency_key_header` is not `idempotency-key`: a front end that reads
    /// bodies is then told its name (`KeyHeader`).
    pub(crate) custom_key_header: bool,
    pub(crate) request_id_header: Option<HeaderName>,
    pub(crate) attempt_header: Option<HeaderName>,
}

/// A policy's settings, built and checked. Private to `policy/`: the rest of the crate reads
/// them through `RetryPolicy`'s narrow methods.
pub(crate) struct Inner {
    pub(super) max_retries: u32,
    pub(super) routes: RouteTable,
    pub(super) host_routes: host_routes::HostRoutes,
    pub(super) key_trust: key_trust::KeyTrust,
    pub(super) mint_idempotency_keys: bool,
    pub(super) backoff: Backoff,
    pub(super) jitter: bool,
    pub(super) responses: ResponseRules,
    pub(super) on_attempt: Option<AttemptHook>,
    pub(super) deadline: Option<Duration>,
    pub(super) attempt_timeout: Option<Duration>,
    pub(super) replay_buffer: usize,
    pub(super) budget: Option<Arc<dyn Budget + Send + Sync>>,
    pub(super) headers: Headers,
    pub(super) hedge: Option<crate::hedge::Hedger>,
    /// Deadlines across hops: where they are handed on, whether they are inherited.
    pub(super) hops: hops::Hops,
    /// The instruments requests record in, made once from the builder's meter.
    #[cfg(feature = "opentelemetry")]
    pub(super) metrics: Option<crate::metrics::client::ClientInstruments>,
    /// Whether the warning that a request's host was not visible has been logged.
    pub(super) warned_host_unknown: std::sync::atomic::AtomicBool,
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.inner;
        f.debug_struct("RetryPolicy")
            .field("max_retries", &i.max_retries)
            .field("routes", &i.routes.len())
            .field("key_trust", &i.key_trust)
            .field("mint_idempotency_keys", &i.mint_idempotency_keys)
            .field("idempotency_key_header", &i.headers.idempotency_key_header)
            .field("backoff", &(i.backoff.initial, i.backoff.max))
            .field("jitter", &i.jitter)
            .field("retry_statuses", &i.responses.retry_statuses)
            .field("not_applied_statuses", &i.responses.not_applied_statuses)
            .field("response_hook", &i.responses.hook.as_ref().map(|_| "set"))
            .field("on_attempt", &i.on_attempt.as_ref().map(|_| "set"))
            .field("max_retry_after", &i.responses.max_retry_after)
            .field("deadline", &i.deadline)
            .field("attempt_timeout", &i.attempt_timeout)
            .field("replay_buffer", &i.replay_buffer)
            .field("budget", &i.budget.as_ref().map(|_| "enabled"))
            .field("should_retry_header", &i.responses.should_retry_header)
            .field(
                "stored_response_header",
                &i.responses.stored_response_header,
            )
            .field("request_id_header", &i.headers.request_id_header)
            .field("attempt_header", &i.headers.attempt_header)
            .field("hedge", &i.hedge)
            .field("metrics", &metrics_set(i))
            .field("origin", &self.origin.as_deref())
            .finish()
    }
}

/// Whether the policy records metrics (always false without the feature `opentelemetry`).
fn metrics_set(inner: &Inner) -> bool {
    #[cfg(feature = "opentelemetry")]
    return inner.metrics.is_some();
    #[cfg(not(feature = "opentelemetry"))]
    {
        let _ = inner;
        false
    }
}

impl RetryPolicy {
    /// The instruments requests record in, if the policy was given a meter.
    #[cfg(feature = "opentelemetry")]
    #[inline]
    pub(crate) fn metrics(&self) -> Option<&crate::metrics::client::ClientInstruments> {
        self.inner.metrics.as_ref()
    }

    /// The headers the policy reads and writes.
    #[inline]
    pub(crate) fn headers(&self) -> &Headers {
        &self.inner.headers
    }

    /// Retries allowed per request, unless its options say otherwise.
    #[inline]
    pub(crate) fn max_retries(&self) -> u32 {
        self.inner.max_retries
    }

    /// Whether the policy mints idempotency keys for writes.
    #[inline]
    pub(crate) fn mints_keys(&self) -> bool {
        self.inner.mint_idempotency_keys
    }

    /// The request's deadline and each attempt's timeout, unless its options say otherwise.
    #[inline]
    pub(crate) fn timeouts(&self) -> (Option<Duration>, Option<Duration>) {
        (self.inner.deadline, self.inner.attempt_timeout)
    }

    /// The replay buffer's limit, in bytes.
    #[inline]
    pub(crate) fn replay_buffer(&self) -> usize {
        self.inner.replay_buffer
    }

    /// The policy's hedging, if it hedges.
    #[inline]
    pub(crate) fn hedging(&self) -> Option<&crate::hedge::Hedger> {
        self.inner.hedge.as_ref()
    }

    /// Deadlines across hops.
    #[inline]
    pub(crate) fn hops(&self) -> &hops::Hops {
        &self.inner.hops
    }

    /// The origin the layer was told, if any.
    #[inline]
    pub(crate) fn origin(&self) -> Option<&HostScope> {
        self.origin.as_deref()
    }

    /// The caller's attempt hook, if any.
    #[inline]
    pub(crate) fn on_attempt(&self) -> Option<&AttemptHook> {
        self.inner.on_attempt.as_ref()
    }

    /// This policy, for a client whose requests may not show the host they go to: `origin`
    /// (a base URL such as `http://127.0.0.1:50051`, an authority `host:port`, or a host) is
    /// the host and port the host-scoped settings
    /// ([`route_for_host`](crate::RetryPolicyBuilder::route_for_host),
    /// [`honor_idempotency_key_for_host`](crate::RetryPolicyBuilder::honor_idempotency_key_for_host))
    /// see for a request whose URI has no host and that carries no `Host` header. A request
    /// that names its host keeps it.
    ///
    /// tonic's generated clients send a path alone (`/pkg.Ledger/Put`): the `Channel` adds
    /// its endpoint's authority below the layer. Without an origin such a call is classified
    /// failing closed (see [`RequestVerdict::host_unknown`]): a host-scoped rule that calls
    /// the path a write holds for every host, host-scoped `Idempotent` rules and key trust do
    /// not apply, and a warning is logged once. Give the layer the `Channel`'s endpoint. A
    /// generated client built `with_origin` puts an authority in every call's URI, but the
    /// `Channel` replaces it with its endpoint's: on a `Channel` (a tonic body below the
    /// layer) the URI's authority decides nothing, only this origin does.
    ///
    /// The result shares this policy's settings and retry budget. An `origin` that is not a
    /// host, an authority or a base URL is refused with an error that names it, and so is one
    /// that cannot be where a channel sends: port 0, an unspecified address (`0.0.0.0`,
    /// `[::]`), a scheme other than `http` or `https`. (Rules scoped to the real endpoint would
    /// not apply to a call classified for such an origin.)
    ///
    /// ```
    /// use http::Method;
    /// use tower_retry_safety::classify::VerdictSource;
    /// use tower_retry_safety::{Idempotency, RetryPolicy};
    ///
    /// let policy = RetryPolicy::builder()
    ///     .route_for_host("127.0.0.1:50051", Method::POST, "/lab.v1.Ledger/Put", Idempotency::Idempotent)
    ///     .build()?;
    /// let call = || http::Request::post("/lab.v1.Ledger/Put").body(()).unwrap();
    /// // No host in the call: the host-scoped rule that would make it a read does not apply.
    /// assert_eq!(policy.classify(&call()).source(), VerdictSource::Method);
    /// assert!(policy.classify(&call()).host_unknown());
    /// // The channel's endpoint, given to the layer: the rule applies.
    /// let for_channel = policy.for_origin("http://127.0.0.1:50051")?;
    /// assert_eq!(for_channel.classify(&call()).source(), VerdictSource::Route);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn for_origin(&self, origin: &str) -> Result<RetryPolicy, BuildError> {
        let scope = host_routes::origin_scope(origin)?;
        Ok(RetryPolicy {
            inner: Arc::clone(&self.inner),
            origin: Some(Arc::new(scope)),
        })
    }

    /// Whether a repeat of `req` is harmless, and which rule decided. Allocates nothing, but
    /// for a path over 256 bytes that a route rule must also match in another spelling (see
    /// [`route`](crate::RetryPolicyBuilder::route)).
    ///
    /// Precedence, highest first: a [`NoRetry`] or [`Idempotency`] marker in the request's
    /// extensions; a route rule; a well-formed `Idempotency-Key` header that the target is
    /// trusted to honour; the method. A key the target is trusted to honour also makes a
    /// repeat harmless when a marker or rule decided — unless that trust is only unscoped and
    /// the marker or rule calls the request a write (see
    /// [`honor_idempotency_key`](crate::RetryPolicyBuilder::honor_idempotency_key)).
    pub fn classify<B>(&self, req: &Request<B>) -> RequestVerdict {
        self.classify_parts(
            req.method(),
            || crate::classify::host::of_request(req.uri(), req.headers(), req.version()),
            req.uri().path(),
            self.idempotency_key(req.headers()).is_some(),
            req.extensions(),
        )
    }

    /// [`classify`](Self::classify) for clients whose requests are not `http::Request`s.
    /// `path` excludes the query string; `has_key` says whether the request carries a
    /// well-formed idempotency key (the caller reads the header once and keeps the key);
    /// `host` is called only if the policy trusts named hosts.
    #[inline]
    pub(crate) fn classify_parts<'h>(
        &self,
        method: &Method,
        host: impl FnOnce() -> HostSeen<'h>,
        path: &str,
        has_key: bool,
        extensions: &Extensions,
    ) -> RequestVerdict {
        let inner = &*self.inner;
        // Found only when something is scoped to hosts: finding the host in a URI is a good
        // part of the layer's work (`benches/classify.rs`).
        let scoped = !(inner.host_routes.is_empty() && inner.key_trust.hosts.is_empty());
        let host = if scoped {
            host().target(self.origin.as_deref())
        } else {
            None
        };
        let host_unknown = scoped && host.is_none();
        if host_unknown {
            events::host_unknown(&inner.warned_host_unknown, method, path);
        }
        let host = host.as_ref();
        let (idempotency, source) = if let Some(marker) = extensions.get::<Idempotency>() {
            (*marker, VerdictSource::Marker)
        } else if let Some(rule) = inner
            .host_routes
            .lookup(host, method, path)
            .or_else(|| inner.routes.lookup(method, path))
        {
            (rule, VerdictSource::Route)
        } else {
            (Idempotency::of_method(method), VerdictSource::Method)
        };
        let explicit_write =
            source != VerdictSource::Method && idempotency == Idempotency::NonIdempotent;
        let read = is_safe_method(method) && !explicit_write;
        if extensions.get::<NoRetry>().is_some() {
            // Exactly one attempt; whether it can have applied anything is still what the
            // markers and rules say (a GET a rule calls a write is a write).
            return RequestVerdict::no_retry(read);
        }
        let trusted = inner.key_trust.trusted(method, host, path, explicit_write);
        let verdict = RequestVerdict::new(idempotency, source)
            .with_read(read)
            .with_host_unknown(host_unknown)
            .with_key_trust(trusted)
            .with_key(has_key);
        if verdict.is_keyed()
            && source == VerdictSource::Method
            && idempotency == Idempotency::NonIdempotent
        {
            // The key decides where only the method spoke, and called it a write. A read's
            // verdict stays the method's (keyed too): a key makes a read no more repeatable,
            // and hedging, which takes only requests idempotent of themselves (or keyed writes
            // when told to), still takes it.
            return RequestVerdict::new(Idempotency::Idempotent, VerdictSource::IdempotencyKey)
                .with_host_unknown(host_unknown)
                .with_key_trust(true)
                .with_key(true);
        }
        verdict
    }

    /// Puts a fresh idempotency key in `headers` and returns it. The caller decides whether
    /// the request gets one (see `attempts::Plan::mint_key`): once per request, before the
    /// first attempt; retries reuse the request's headers, so they carry the same key.
    pub(crate) fn mint_key(&self, headers: &mut HeaderMap) -> Option<Box<str>> {
        const LEN: usize = uuid::fmt::Hyphenated::LENGTH;
        let mut text = [b'"'; LEN + 2];
        uuid::Uuid::new_v4()
            .hyphenated()
            .encode_lower(&mut text[1..=LEN]);
        // Hex, hyphens and quotes: always a valid header value and UTF-8. The key is kept
        // as the report shows any key: the sf-string's content, without its quotes.
        let value = HeaderValue::from_bytes(&text).ok()?;
        let key = std::str::from_utf8(&text[1..=LEN]).ok()?.into();
        headers.insert(self.inner.headers.idempotency_key_header.clone(), value);
        Some(key)
    }

    /// The request's idempotency key, if it carries a well-formed one (whether or not the
    /// policy honours keys).
    pub(crate) fn idempotency_key<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        headers
            .get(&self.inner.headers.idempotency_key_header)
            .and_then(idempotency_key::parse)
    }

    /// Classifies the response to a request with this `verdict`: its status against the retry
    /// set, the server's `x-should-retry` hint and its `Retry-After` / `retry-after-ms` delay.
    ///
    /// - A response marked as a stored response (`idempotent-replayed: true`, see
    ///   [`stored_response_header`](crate::RetryPolicyBuilder::stored_response_header)) is final whatever its status, and
    ///   [`is_stored_response`](Classification::is_stored_response) says so: the server answers every repeat of
    ///   the key with the same stored response.
    /// - `x-should-retry: false` makes any response final; `true` makes a non-success response
    ///   retryable (the decision still suppresses it for non-idempotent requests).
    /// - A status in the retry set is [`FailureClass::RetryableResponse`](crate::classify::FailureClass),
    ///   with the server's delay if it gave a readable one. A delay above
    ///   [`max_retry_after`](crate::RetryPolicyBuilder::max_retry_after) ends the retries and
    ///   [`is_retry_after_too_long`](Classification::is_retry_after_too_long) says so; the class
    ///   stays the status's.
    /// - A 409 to a request with an idempotency key the policy honours is retryable: the
    ///   original is still in flight on the server, so the same key is tried again later.
    /// - A 2xx with a gRPC content type (`application/grpc…`) is read as a gRPC call's answer:
    ///   its `grpc-status` gives the class (see the `grpc` module; never *not sent*). This
    ///   function sees the response only, so it cannot tell that the request was a POST, as
    ///   the layer does: give it gRPC responses to gRPC calls.
    /// - Everything else is final. Allocates nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_retry_safety::{FailureClass, RetryPolicy};
    ///
    /// let policy = RetryPolicy::builder().build()?;
    /// let req = http::Request::get("/v1/things").body(())?;
    /// let res = http::Response::builder().status(429).header("retry-after", "3").body(())?;
    /// let c = policy.classify_response(&policy.classify(&req), &res);
    /// assert_eq!(c.class(), FailureClass::RetryableResponse);
    /// assert_eq!(c.retry_after(), Some(Duration::from_secs(3)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn classify_response<B>(
        &self,
        verdict: &RequestVerdict,
        res: &Response<B>,
    ) -> Classification {
        let body_verdict = res.extensions().get::<BodyVerdict>().map(|v| v.0);
        // Any response may be a gRPC one here: its content type says.
        self.classify_status(verdict, res.status(), res.headers(), body_verdict, true)
    }

    /// Whether the server marked this response to the request as its stored response.
    pub(crate) fn is_stored_response(&self, verdict: &RequestVerdict, headers: &HeaderMap) -> bool {
        response::is_stored_response(&self.inner.responses, verdict, headers)
    }

    /// `grpc`: the request was a gRPC call, so a 2xx response's `grpc-status` is read; other
    /// requests are spared the look at the content type.
    pub(crate) fn classify_status(
        &self,
        verdict: &RequestVerdict,
        status: http::StatusCode,
        headers: &HeaderMap,
        body_verdict: Option<FailureClass>,
        grpc: bool,
    ) -> Classification {
        response::classify(
            &self.inner.responses,
            verdict,
            status,
            headers,
            body_verdict,
            grpc,
            SystemTime::now,
        )
    }
}
