use http::Method;

/// Whether repeating a request is harmless.
///
/// Besides being the outcome of [`RetryPolicy::classify`](crate::policy::RetryPolicy::classify), it is a
/// marker: put it in a request's extensions to override every other rule for that request.
///
/// ```
/// use tower_retry_safety::classify::VerdictSource;
/// use tower_retry_safety::{Idempotency, RetryPolicy};
///
/// let policy = RetryPolicy::builder().build()?;
/// let mut req = http::Request::post("/v1/tools/execute").body(())?;
/// req.extensions_mut().insert(Idempotency::NonIdempotent);
/// let verdict = policy.classify(&req);
/// assert_eq!(verdict.source(), VerdictSource::Marker);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Idempotency {
    /// Repeating the request has the same effect as sending it once: it may be retried after
    /// any transient failure.
    Idempotent,
    /// Repeating the request may repeat a side effect: it is retried only when the failed
    /// attempt provably never reached the server.
    NonIdempotent,
}

/// Whether `method` is safe: GET, HEAD, OPTIONS and TRACE (RFC 9110 §9.2.1), and QUERY (the
/// IETF httpbis draft defines it safe and idempotent: a read with a body). The one list of
/// safe methods: a request with one is a read unless a marker or rule calls it a write.
/// Not `Method::is_safe`, whose list depends on the `http` crate's version.
pub(crate) fn is_safe_method(method: &Method) -> bool {
    method == Method::GET
        || method == Method::HEAD
        || method == Method::OPTIONS
        || method == Method::TRACE
        || method.as_str() == "QUERY"
}

impl Idempotency {
    /// The RFC 9110 §9.2.2 default for a method: the safe methods (GET, HEAD, OPTIONS, TRACE,
    /// and QUERY, which its draft defines safe and idempotent), PUT and DELETE are idempotent;
    /// POST, PATCH, CONNECT and every other extension method are not.
    pub fn of_method(method: &Method) -> Self {
        if is_safe_method(method) || method == Method::PUT || method == Method::DELETE {
            Idempotency::Idempotent
        } else {
            Idempotency::NonIdempotent
        }
    }

    /// The RFC 9110 default for a method named by a string, such as the method of a call
    /// tunnelled through a proxy endpoint (`POST /proxy` with `{"method": "PUT", …}`), where
    /// the outer request's method says nothing: [`of_method`](Self::of_method) of the parsed
    /// name. Method names are case-sensitive (RFC 9110 §9.1), so `"put"` is an extension
    /// method, and a name that is not a valid method is too: both are
    /// [`NonIdempotent`](Self::NonIdempotent), as an unknown method is.
    ///
    /// ```
    /// use tower_retry_safety::{Idempotency, RetryPolicy};
    ///
    /// let tunnelled = "PUT"; // read from the proxy call's body
    /// let mut req = http::Request::post("/v1/proxy").body(())?;
    /// req.extensions_mut().insert(Idempotency::from_method(tunnelled));
    /// let policy = RetryPolicy::builder().build()?;
    /// assert_eq!(policy.classify(&req).idempotency(), Idempotency::Idempotent);
    ///
    /// assert_eq!(Idempotency::from_method("POST"), Idempotency::NonIdempotent);
    /// assert_eq!(Idempotency::from_method("put"), Idempotency::NonIdempotent);
    /// assert_eq!(Idempotency::from_method("GET /x"), Idempotency::NonIdempotent);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_method(method: impl AsRef<[u8]>) -> Self {
        Method::from_bytes(method.as_ref())
            .map_or(Idempotency::NonIdempotent, |m| Idempotency::of_method(&m))
    }
}

/// Marker for a request that must be attempted exactly once, whatever happens.
///
/// This is the per-request form of the "client without retries" that SDKs keep for their write
/// calls. It takes precedence over every other rule.
///
/// ```
/// use tower_retry_safety::{NoRetry, RetryPolicy};
///
/// let policy = RetryPolicy::builder().build()?;
/// let mut req = http::Request::get("/v1/report").body(())?;
/// req.extensions_mut().insert(NoRetry);
/// assert!(policy.classify(&req).is_no_retry());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NoRetry;

/// Which rule decided a [`RequestVerdict`].
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VerdictSource {
    /// A [`NoRetry`] or [`Idempotency`] marker in the request's extensions.
    Marker,
    /// A route rule (method and path template) of the policy.
    Route,
    /// A well-formed `Idempotency-Key` header, honoured because the policy was told the target
    /// honours keys, on a request whose method alone would make it a write (a keyed GET or
    /// PUT stays [`Method`](Self::Method), and [`is_keyed`](RequestVerdict::is_keyed)).
    IdempotencyKey,
    /// The request method, per RFC 9110.
    Method,
}

impl VerdictSource {
    /// A short lowercase name, for logs and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            VerdictSource::Marker => "marker",
            VerdictSource::Route => "route",
            VerdictSource::IdempotencyKey => "idempotency-key",
            VerdictSource::Method => "method",
        }
    }
}

/// Whether a repeat of a request is harmless, and which rule said so.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RequestVerdict {
    idempotency: Idempotency,
    source: VerdictSource,
    no_retry: bool,
    keys_honored: bool,
    /// A well-formed key, trusted or not.
    has_key: bool,
    keyed: bool,
    /// A read: a safe method (GET, HEAD, OPTIONS, TRACE) that no marker or rule calls a
    /// write. Nothing it does can have been applied.
    read: bool,
    /// The policy scopes rules or key trust to hosts and the request's host was not visible.
    host_unknown: bool,
}

impl RequestVerdict {
    /// A request with the [`NoRetry`] marker. Nothing is repeated for it, so it is treated as
    /// the cautious case; `read`: a safe method that no other marker or rule calls a write
    /// (`NoRetry` itself calls nothing a write).
    pub(crate) const fn no_retry(read: bool) -> Self {
        RequestVerdict {
            idempotency: Idempotency::NonIdempotent,
            source: VerdictSource::Marker,
            no_retry: true,
            keys_honored: false,
            has_key: false,
            keyed: false,
            read,
            host_unknown: false,
        }
    }

    /// A verdict for a request that is not a read (see [`with_read`](Self::with_read)).
    pub(crate) const fn new(idempotency: Idempotency, source: VerdictSource) -> Self {
        RequestVerdict {
            idempotency,
            source,
            no_retry: false,
            keys_honored: false,
            has_key: false,
            keyed: false,
            read: false,
            host_unknown: false,
        }
    }

    /// Whether the request is a read: a safe method that no marker or rule calls a write.
    pub(crate) const fn with_read(mut self, read: bool) -> Self {
        self.read = read;
        self
    }

    /// Whether host-scoped settings could not see the request's host.
    pub(crate) const fn with_host_unknown(mut self, unknown: bool) -> Self {
        self.host_unknown = unknown;
        self
    }

    /// Whether the request can change the server's state: `false` only for a safe method
    /// (GET, HEAD, OPTIONS, TRACE, RFC 9110 §9.2.1, and QUERY) that no marker or route rule calls
    /// [`NonIdempotent`](Idempotency::NonIdempotent). A PUT or DELETE can (repeating it is
    /// harmless, but it may have happened); so can every gRPC call (each is a POST).
    /// [`RetryReport::may_have_been_applied`](crate::attempts::RetryReport::may_have_been_applied) is
    /// `false` for a request that cannot.
    pub fn can_apply(&self) -> bool {
        !self.read
    }

    /// True when the policy scopes route rules or key trust to hosts and this request's host
    /// was not visible to the layer (a request in origin form without a `Host` header, such as
    /// a tonic generated client's call through a `Channel`, which adds the authority below the
    /// layer). Such a request is classified failing closed: a host-scoped rule that calls its
    /// path [`NonIdempotent`](Idempotency::NonIdempotent) holds, whatever the host; host-scoped
    /// `Idempotent` rules and host-scoped key trust do not apply. Give the layer its origin
    /// with [`RetryPolicy::for_origin`](crate::policy::RetryPolicy::for_origin).
    pub fn host_unknown(&self) -> bool {
        self.host_unknown
    }

    /// Whether the request's target is trusted to honour a key on this request.
    pub(crate) fn with_key_trust(mut self, honored: bool) -> Self {
        self.keys_honored = honored;
        self
    }

    /// Whether the request carries a well-formed key (its own or a minted one); it counts
    /// only where keys are trusted.
    pub(crate) fn with_key(mut self, has_key: bool) -> Self {
        self.has_key = has_key;
        self.keyed = has_key && self.keys_honored;
        self
    }

    /// Whether the request carries a well-formed key, whether or not its target is trusted
    /// to honour it.
    pub(crate) fn has_key(&self) -> bool {
        self.has_key
    }

    /// Whether a repeat of the request is harmless. A [`NoRetry`] request reports
    /// [`Idempotency::NonIdempotent`].
    pub fn idempotency(&self) -> Idempotency {
        self.idempotency
    }

    /// Which rule decided.
    pub fn source(&self) -> VerdictSource {
        self.source
    }

    /// Whether the request carries the [`NoRetry`] marker: it gets exactly one attempt.
    pub fn is_no_retry(&self) -> bool {
        self.no_retry
    }

    /// Whether the request carries a well-formed idempotency key that its target is trusted
    /// to honour (see [`keys_honored`](Self::keys_honored)). Such a request is safe to repeat
    /// with the same key, whatever its idempotency: a rule or marker that calls it a write
    /// decides the verdict's source, the key makes the repeat harmless.
    pub fn is_keyed(&self) -> bool {
        self.keyed
    }

    /// Whether the policy trusts this request's target to honour an idempotency key on it,
    /// whether or not the request carries one: the trust the policy was given (unscoped, or
    /// for the request's host) that applies to this request.
    pub fn keys_honored(&self) -> bool {
        self.keys_honored
    }

    /// True when a retry after an ambiguous failure or a retryable response is allowed: the
    /// request is idempotent, or carries a key its target is trusted to honour.
    pub(crate) fn repeat_is_harmless(&self) -> bool {
        !self.no_retry && (self.idempotency == Idempotency::Idempotent || self.keyed)
    }
}
