use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, Method, StatusCode};
use tower::retry::budget::{Budget, TpsBudget};

use super::host_routes::HostRoutes;
use super::key_trust::KeyTrust;
use super::statuses::StatusSet;
use super::{AttemptEvent, AttemptHook, Inner, ResponseHook, RetryPolicy};
use crate::backoff::Backoff;
pub use crate::build_error::BuildError;
use crate::classify::routes::RouteTable;
use crate::classify::{FailureClass, Idempotency};
use crate::LockFreeBudget;

/// The replay buffer's default limit, in bytes.
const DEFAULT_REPLAY_BUFFER: usize = 64 * 1024;
/// The largest replay buffer a policy may keep per request.
const MAX_REPLAY_BUFFER: usize = 1 << 30;

/// The most retries a policy may allow. More than this is a retry storm, not a policy.
pub(crate) const MAX_RETRIES_LIMIT: u32 = 100;

/// Builds a [`RetryPolicy`]. Setters consume and return the builder; nothing is checked until
/// [`build`](Self::build), which names the first bad input in its [`BuildError`].
#[derive(Debug)]
pub struct RetryPolicyBuilder {
    max_retries: u32,
    routes: Vec<(Method, String, Idempotency)>,
    host_routes: Vec<(String, Method, String, Idempotency)>,
    honor_idempotency_key: bool,
    key_hosts: Vec<String>,
    key_routes: Vec<(Method, String, bool)>,
    mint_idempotency_keys: bool,
    idempotency_key_header: HeaderName,
    backoff: Backoff,
    jitter: bool,
    retry_statuses: Vec<StatusCode>,
    not_applied_statuses: Vec<StatusCode>,
    response_hook: Option<ResponseHook>,
    on_attempt: Option<AttemptHook>,
    max_retry_after: Duration,
    deadline: Option<Duration>,
    attempt_timeout: Option<Duration>,
    replay_buffer: usize,
    budget: BudgetChoice,
    should_retry_header: Option<HeaderName>,
    replay_header: Option<HeaderName>,
    request_id_header: Option<HeaderName>,
    attempt_header: Option<HeaderName>,
}

enum BudgetChoice {
    LockFree {
        ttl: Duration,
        min_per_sec: u32,
        retry_percent: f32,
    },
    Tps {
        ttl: Duration,
        min_per_sec: u32,
        retry_percent: f32,
    },
    Custom(Arc<dyn Budget + Send + Sync>),
    Unlimited,
}

impl fmt::Debug for BudgetChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BudgetChoice::LockFree {
                ttl,
                min_per_sec,
                retry_percent,
            } => f
                .debug_struct("LockFreeBudget")
                .field("ttl", ttl)
                .field("min_per_sec", min_per_sec)
                .field("retry_percent", retry_percent)
                .finish(),
            BudgetChoice::Tps {
                ttl,
                min_per_sec,
                retry_percent,
            } => f
                .debug_struct("TpsBudget")
                .field("ttl", ttl)
                .field("min_per_sec", min_per_sec)
                .field("retry_percent", retry_percent)
                .finish(),
            BudgetChoice::Custom(_) => f.write_str("Custom"),
            BudgetChoice::Unlimited => f.write_str("Unlimited"),
        }
    }
}

impl Default for RetryPolicyBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryPolicyBuilder {
    /// A builder with the defaults listed on each setter.
    pub fn new() -> Self {
        RetryPolicyBuilder {
            max_retries: 2,
            routes: Vec::new(),
            host_routes: Vec::new(),
            honor_idempotency_key: false,
            key_hosts: Vec::new(),
            key_routes: Vec::new(),
            mint_idempotency_keys: false,
            idempotency_key_header: HeaderName::from_static("idempotency-key"),
            backoff: Backoff {
                initial: Duration::from_millis(500),
                max: Duration::from_secs(8),
            },
            jitter: true,
            not_applied_statuses: Vec::new(),
            response_hook: None,
            on_attempt: None,
            retry_statuses: [408, 429, 500, 502, 503, 504]
                .into_iter()
                .filter_map(|s| StatusCode::from_u16(s).ok())
                .collect(),
            max_retry_after: Duration::from_secs(60),
            deadline: None,
            attempt_timeout: None,
            replay_buffer: DEFAULT_REPLAY_BUFFER,
            budget: BudgetChoice::LockFree {
                ttl: Duration::from_secs(10),
                min_per_sec: 10,
                retry_percent: 0.2,
            },
            should_retry_header: Some(HeaderName::from_static("x-should-retry")),
            replay_header: Some(HeaderName::from_static("idempotent-replayed")),
            request_id_header: Some(HeaderName::from_static("x-request-id")),
            attempt_header: None,
        }
    }

    /// How many times a request may be retried after its first attempt.
    ///
    /// Defaults to 2 (3 attempts in all). At most 100.
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.max_retries = retries;
        self
    }

    /// A rule for `method` on paths matching `template`, in axum/matchit syntax:
    /// `/v1/tools/{slug}/execute`, `/v1/files/{*path}`. The query string never takes part in
    /// matching. A rule outranks the method, and is outranked by a marker in the request's
    /// extensions. A rule that calls a route [`NonIdempotent`](Idempotency::NonIdempotent)
    /// also keeps a key on it from counting under unscoped trust
    /// ([`honor_idempotency_key`](Self::honor_idempotency_key)); trust scoped to the host
    /// ([`honor_idempotency_key_for_host`](Self::honor_idempotency_key_for_host)) still counts.
    ///
    /// Servers route other spellings of a path to the same handler, so the request's path is
    /// matched in four spellings, and the stricter verdict wins:
    ///
    /// 1. **As sent**, against the templates as written, case-sensitively (as axum and matchit
    ///    route). This is the only spelling an [`Idempotent`](Idempotency::Idempotent) rule
    ///    matches: a guess about how the server normalises never makes a write retryable.
    /// 2. **Normalised**, against the templates as written: percent-escapes of unreserved
    ///    characters (`A-Z a-z 0-9 - . _ ~`, hex digits in either case) decoded, every other
    ///    escape (`%2F`, `%20`, `%C3%A9`) left as sent, so `/a%2Fb` stays one segment; then
    ///    `.` and `..` segments removed (RFC 3986 §5.2.4; `%2e` counts as a dot) and empty
    ///    segments dropped, so `//` reads as `/` and a trailing slash is ignored.
    /// 3. **Normalised and in ASCII lower case**, against the templates normalised and
    ///    lower-cased the same way (parameter names aside), for servers that route
    ///    case-insensitively (IIS, ASP.NET, Express, some gateways).
    /// 4. **Leniently**, then normalised and lower-cased, against those same templates:
    ///    `;parameters` cut from each segment (Tomcat, Jetty and Spring do before routing),
    ///    every escape of an ASCII character decoded, `%2F` included (gunicorn with Flask or
    ///    Django, Go's `http.ServeMux`), and `\` read as `/` (IIS); again while an escape is
    ///    left, up to three rounds (a path still escaped after that counts as a write).
    ///
    /// A [`NonIdempotent`](Idempotency::NonIdempotent) rule counts if it matches any spelling.
    /// So a `NonIdempotent` rule for `PUT /v1/send/{id}` also covers `/v1/send/m1/`,
    /// `/v1/%73end/m1`, `/v1//send/m1`, `/v1/./send/m1`, `/V1/SEND/m1`, `/v1/send;v=1/m1`
    /// and `/v1%2Fsend/m1`, even where an
    /// `Idempotent` rule such as `/v1/{*rest}` matches the path as sent. Within one spelling the
    /// most specific rule wins (static, then parameter, then catch-all), so a specific
    /// `Idempotent` exception to a `NonIdempotent` catch-all holds for its own spelling. Rules
    /// that differ only in letter case or spelling (`/v1/Send/{id}` and `/v1/send/{id}/`) are
    /// one route to a server that folds them: the stricter of their verdicts holds in the
    /// folded spelling.
    ///
    /// [`build`](Self::build) refuses a template that does not start with `/`, has a query, has
    /// more than 16 parameters, has a `.` or `..` segment (servers remove those before routing,
    /// so the rule would match nothing they route), repeats a rule, or overlaps another rule as
    /// matchit sees it, as written or once folded.
    ///
    /// Defaults to no rules. Lookup cost does not depend on the number of rules; a path with
    /// other spellings is respelled on the stack (on the heap only past 256 bytes).
    pub fn route(mut self, method: Method, template: &str, idempotency: Idempotency) -> Self {
        self.routes.push((method, template.to_owned(), idempotency));
        self
    }

    /// A rule like [`route`](Self::route) that applies only to requests for `host`: one client
    /// often talks to several APIs, and a rule for one must never apply to another. For its
    /// host, a host's rule outranks a rule for every host.
    ///
    /// `host` is what you hold: a host (`api.example.com`, `[::1]`: every port), an authority
    /// with a port (`localhost:8080`: that port only), or a base URL
    /// (`https://api.example.com/v1`: its host, on its port unless that is the scheme's
    /// default; the path is ignored, since templates are whole paths). Hosts are compared in
    /// one canonical form, so every spelling of the same host matches: letter case, a
    /// trailing dot (`api.example.com.`), percent-escapes, an IPv6 address written long
    /// (`[0:0:0:0:0:0:0:1]`), an IPv4-mapped one, and the IPv4 shorthands resolvers accept
    /// (`127.1`, `0x7f.0.0.1`). A request's port is its own or its scheme's default; a rule
    /// for a host and port outranks one for the host on every port.
    ///
    /// [`build`](Self::build) refuses an empty host, user information (never echoed: it may
    /// be a password), a path without a scheme, and a bad template as `route` does.
    ///
    /// ```
    /// use http::Method;
    /// use tower_retry_safety::{Idempotency, RetryPolicy};
    ///
    /// let policy = RetryPolicy::builder()
    ///     // Search is a read on one API; another API's /v1/search may not be.
    ///     .route_for_host("api.example.com", Method::POST, "/v1/search", Idempotency::Idempotent)
    ///     .build()?;
    /// # drop(policy);
    /// # Ok::<(), tower_retry_safety::BuildError>(())
    /// ```
    ///
    /// Defaults to no such rules.
    pub fn route_for_host(
        mut self,
        host: &str,
        method: Method,
        template: &str,
        idempotency: Idempotency,
    ) -> Self {
        self.host_routes
            .push((host.to_owned(), method, template.to_owned(), idempotency));
        self
    }

    /// Trust every target to honour idempotency keys: a request that carries a well-formed key
    /// is safe to repeat with the same key (which the layer never changes), so a write with a
    /// key is retried after an ambiguous failure and a retryable response.
    ///
    /// This trust is unscoped, so it yields to anything more specific: it does not cover a
    /// request that a marker or a route rule calls
    /// [`NonIdempotent`](Idempotency::NonIdempotent) (such a rule often marks an endpoint
    /// that ignores keys). Trust one API's host with
    /// [`honor_idempotency_key_for_host`](Self::honor_idempotency_key_for_host) instead when
    /// a client talks to several.
    ///
    /// | a keyed request that… | unscoped trust | its host trusted | no trust |
    /// |---|---|---|---|
    /// | only its method calls a write (a plain `POST`) | retried | retried | not retried |
    /// | a marker or rule calls `NonIdempotent` | **not** retried | retried | not retried |
    ///
    /// A route's own word ([`route_honors_idempotency_key`](Self::route_honors_idempotency_key))
    /// outranks both columns.
    ///
    /// ("Retried" means: after an ambiguous failure or a retryable response; a request that
    /// was provably not sent is retried in every case.)
    ///
    /// Defaults to false.
    pub fn honor_idempotency_key(mut self, honor: bool) -> Self {
        self.honor_idempotency_key = honor;
        self
    }

    /// Trust `host` to honour idempotency keys, on every path: a keyed request to it is safe to
    /// repeat with the same key, even one that a marker or route rule calls
    /// [`NonIdempotent`](Idempotency::NonIdempotent) (the host honours keys, so the key makes
    /// the repeat harmless). Call it once per host. `host` is a host, an authority with a
    /// port, or a base URL, compared in canonical form, as for
    /// [`route_for_host`](Self::route_for_host), which says what [`build`](Self::build)
    /// refuses.
    ///
    /// Naming a host scopes minted keys' trust too: see
    /// [`mint_idempotency_keys`](Self::mint_idempotency_keys).
    ///
    /// Defaults to no hosts.
    pub fn honor_idempotency_key_for_host(mut self, host: &str) -> Self {
        self.key_hosts.push(host.to_owned());
        self
    }

    /// Whether the endpoint for `method` on paths matching `template` honours idempotency keys:
    /// the most specific word on trust, outranking the host's and unscoped trust. `true`: a
    /// key on a request to it makes a repeat harmless, even where a marker or rule calls the
    /// request a write. `false`: the endpoint ignores keys, so a key never makes a repeat of a
    /// request to it harmless, whatever trust says elsewhere.
    ///
    /// Templates and matching are those of [`route`](Self::route), failing closed the same
    /// way: `false` covers every spelling of a path a server may route alike, `true` only the
    /// path as written. [`build`](Self::build) refuses a bad template as it does there.
    ///
    /// ```
    /// use http::Method;
    /// use tower_retry_safety::RetryPolicy;
    ///
    /// let policy = RetryPolicy::builder()
    ///     .honor_idempotency_key_for_host("api.example.com")
    ///     // This one endpoint predates the API's key support.
    ///     .route_honors_idempotency_key(Method::POST, "/v1/legacy/send", false)
    ///     .build()?;
    /// # drop(policy);
    /// # Ok::<(), tower_retry_safety::BuildError>(())
    /// ```
    ///
    /// Defaults to no such rules.
    pub fn route_honors_idempotency_key(
        mut self,
        method: Method,
        template: &str,
        honors: bool,
    ) -> Self {
        self.key_routes.push((method, template.to_owned(), honors));
        self
    }

    /// Give every non-idempotent request that has no idempotency key a fresh one before its
    /// first attempt, and the very same key on every retry: a Structured Field string of a
    /// random UUID v4 (122 random bits), per the IETF httpapi Idempotency-Key draft. A key the
    /// caller set is never replaced.
    ///
    /// Minting says the targets honour keys. With no host named by
    /// [`honor_idempotency_key_for_host`](Self::honor_idempotency_key_for_host), it turns on
    /// unscoped trust ([`honor_idempotency_key`](Self::honor_idempotency_key), with the limits
    /// said there); with hosts named, keys are trusted on those hosts only (a key is still
    /// minted for other targets: it costs nothing and lets a caller retry by hand with it).
    /// A trusted keyed write is retried after an ambiguous failure, and a 409 (the original
    /// still in flight) is retried with backoff.
    ///
    /// Defaults to false.
    pub fn mint_idempotency_keys(mut self, mint: bool) -> Self {
        self.mint_idempotency_keys = mint;
        self
    }

    /// The header that carries the idempotency key.
    ///
    /// Defaults to `idempotency-key`.
    pub fn idempotency_key_header(mut self, name: HeaderName) -> Self {
        self.idempotency_key_header = name;
        self
    }

    /// Exponential backoff: the first retry waits about `initial`, each next one twice as
    /// long, never more than `max`; each wait is drawn at random in `[delay/2, delay]`.
    ///
    /// Defaults to 500 ms and 8 s. `initial` must not exceed `max`.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.backoff = Backoff { initial, max };
        self
    }

    /// Whether backoff waits are randomised. Turn it off for reproducible waits (tests);
    /// each wait is then exactly the exponential delay.
    ///
    /// Defaults to true.
    pub fn jitter(mut self, jitter: bool) -> Self {
        self.jitter = jitter;
        self
    }

    /// The response statuses that are transient.
    ///
    /// Defaults to 408, 429, 500, 502, 503 and 504. Success (2xx) statuses are refused.
    pub fn retry_statuses(mut self, statuses: impl IntoIterator<Item = StatusCode>) -> Self {
        self.retry_statuses = statuses.into_iter().collect();
        self
    }

    /// Statuses this API returns only before it applies anything — a rate limiter's 429 in
    /// front of the handler, a documented "not processed" error: a response with one is proof
    /// that nothing was applied, classified [`NotSent`](crate::FailureClass::NotSent), so a
    /// write is retried on it too (honouring `Retry-After`), as after a refused connection.
    /// Name only statuses you know to be such proof: a write retried on one that was not is
    /// applied twice.
    ///
    /// Defaults to none. Success (2xx) statuses are refused.
    pub fn not_applied_statuses(mut self, statuses: impl IntoIterator<Item = StatusCode>) -> Self {
        self.not_applied_statuses = statuses.into_iter().collect();
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
        self.response_hook = Some(ResponseHook(Arc::new(hook)));
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
    /// use tower_retry_safety::{Decision, RetryPolicy, StopReason};
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
        self.on_attempt = Some(AttemptHook(Arc::new(hook)));
        self
    }

    /// The longest `Retry-After` the policy waits for. A response asking for longer is final
    /// and its report says so.
    ///
    /// Defaults to 60 s.
    pub fn max_retry_after(mut self, max: Duration) -> Self {
        self.max_retry_after = max;
        self
    }

    /// Total time for a request, counted from its first attempt. An attempt still in flight
    /// when it passes is cut, and a retry whose wait would end past it is not made. A cut
    /// attempt ends in this crate's [`Error`](crate::Error), not a bare timeout: it
    /// [`is_timeout`](crate::Error::is_timeout), and it [`is_ambiguous`](crate::Error::is_ambiguous)
    /// (the request may have been sent and applied), with the report, the request id and
    /// the idempotency key — which a `tower::timeout` outside the layer would lose.
    ///
    /// Per request: [`RequestOptions::deadline`](super::RequestOptions::deadline).
    ///
    /// Defaults to none. Must be above zero.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Time for each attempt: an attempt still in flight when it passes is cut, and that
    /// failure is ambiguous (the request may have been applied), so an idempotent request is
    /// retried and a write is not. The same as a `tower::timeout` inside the layer, except that
    /// a cut that coincides with the deadline ends the request with this crate's error.
    ///
    /// Per request: [`RequestOptions::attempt_timeout`](super::RequestOptions::attempt_timeout).
    ///
    /// Defaults to none. Must be above zero.
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = Some(timeout);
        self
    }

    /// The most bytes of a streaming request body kept so that a retry can replay it (see
    /// [`Replayable`](crate::Replayable)); `0` turns recording off, and a stream is then sent
    /// once. A body is recorded only when the request may be retried, and its chunks are kept
    /// as handles, not copies. A body that is larger (by its size hint before it is sent, or
    /// as it streams) is sent once, and its report says why
    /// ([`NotReplayable::OverLimit`](crate::NotReplayable::OverLimit)). Bodies that can be
    /// copied (`Full`, `Bytes`, `String`…) are not limited by it.
    ///
    /// Defaults to 64 KiB. At most 1 GiB.
    pub fn replay_buffer(mut self, limit_bytes: usize) -> Self {
        self.replay_buffer = limit_bytes;
        self
    }

    /// Limit retries with this crate's [`LockFreeBudget`]: each request deposits, each retry
    /// withdraws, and a retry is allowed while the retries of the last `ttl` stay within
    /// `min_per_sec × ttl` plus `retry_percent` of the requests of the last `ttl` (Finagle's
    /// semantics, as [`tps_budget`](Self::tps_budget)). No lock: a deposit is one atomic add on
    /// a cache line of the calling thread's own. `ttl` is 1–60 s, `retry_percent` 0–1000
    /// (0.2 = 20 % extra load); `build` checks them.
    ///
    /// Defaults to a 10 s window, 10 retries per second floor, 20 % extra load.
    pub fn lock_free_budget(mut self, ttl: Duration, min_per_sec: u32, retry_percent: f32) -> Self {
        self.budget = BudgetChoice::LockFree {
            ttl,
            min_per_sec,
            retry_percent,
        };
        self
    }

    /// Limit retries with tower's [`TpsBudget`](crate::TpsBudget) instead, with the same meaning as
    /// [`lock_free_budget`](Self::lock_free_budget). It takes a mutex and reads the clock on
    /// every deposit and withdrawal, and two threads withdrawing at once can overdraw it.
    /// `ttl` is 1–60 s, `retry_percent` 0–1000, `min_per_sec` below `i32::MAX`; `build` checks
    /// them.
    ///
    /// Defaults to the [`lock_free_budget`](Self::lock_free_budget) above.
    pub fn tps_budget(mut self, ttl: Duration, min_per_sec: u32, retry_percent: f32) -> Self {
        self.budget = BudgetChoice::Tps {
            ttl,
            min_per_sec,
            retry_percent,
        };
        self
    }

    /// Limit retries with any tower [`Budget`](crate::Budget) (re-exported by this crate).
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use tower_retry_safety::{Budget, RetryPolicy};
    ///
    /// /// At most ten retries for the life of the process.
    /// struct TenRetries(AtomicU32);
    ///
    /// impl Budget for TenRetries {
    ///     fn deposit(&self) {}
    ///     fn withdraw(&self) -> bool {
    ///         self.0
    ///             .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
    ///             .is_ok()
    ///     }
    /// }
    ///
    /// let policy = RetryPolicy::builder().budget(TenRetries(AtomicU32::new(10))).build()?;
    /// # drop(policy);
    /// # Ok::<(), tower_retry_safety::BuildError>(())
    /// ```
    ///
    /// Defaults to the [`lock_free_budget`](Self::lock_free_budget) above.
    pub fn budget(mut self, budget: impl Budget + Send + Sync + 'static) -> Self {
        self.budget = BudgetChoice::Custom(Arc::new(budget));
        self
    }

    /// No budget: only [`max_retries`](Self::max_retries) limits retries.
    ///
    /// Defaults to the [`lock_free_budget`](Self::lock_free_budget) above.
    pub fn no_budget(mut self) -> Self {
        self.budget = BudgetChoice::Unlimited;
        self
    }

    /// The server hint header: `false` makes any response final, `true` makes a non-success
    /// response retryable (still suppressed for non-idempotent requests). `None` ignores it.
    ///
    /// Defaults to `x-should-retry`.
    pub fn should_retry_header(mut self, name: Option<HeaderName>) -> Self {
        self.should_retry_header = name;
        self
    }

    /// The header with which a server that honours idempotency keys marks a replay: its stored
    /// response to an earlier request with the same key, sent again (this crate's
    /// [`IdempotencyLayer`](crate::server::IdempotencyLayer) sets `idempotent-replayed: true`).
    /// A response whose header says `true` is final, whatever its status: every repeat of the
    /// key would get the same answer. The report says so
    /// ([`StopReason::Replayed`](crate::StopReason::Replayed)): the server had already run the
    /// request. `None` ignores the header.
    ///
    /// Defaults to `idempotent-replayed`.
    pub fn replay_header(mut self, name: Option<HeaderName>) -> Self {
        self.replay_header = name;
        self
    }

    /// The header whose value identifies a request for support, read from the request or the
    /// response and echoed in errors and reports (capped in length). `None` disables it.
    ///
    /// Defaults to `x-request-id`.
    pub fn request_id_header(mut self, name: Option<HeaderName>) -> Self {
        self.request_id_header = name;
        self
    }

    /// A header set on each attempt to its number (`1` for the first), so servers can see
    /// retries. `None` sets nothing.
    ///
    /// Defaults to none.
    pub fn attempt_header(mut self, name: Option<HeaderName>) -> Self {
        self.attempt_header = name;
        self
    }

    /// Checks every setting and builds the policy.
    pub fn build(self) -> Result<RetryPolicy, BuildError> {
        if self.max_retries > MAX_RETRIES_LIMIT {
            return Err(BuildError::setting(
                "max_retries",
                format!(
                    "{} is above the limit of {MAX_RETRIES_LIMIT}",
                    self.max_retries
                ),
            ));
        }
        if self.backoff.initial > self.backoff.max {
            return Err(BuildError::setting(
                "backoff",
                format!(
                    "initial {:?} is above max {:?}",
                    self.backoff.initial, self.backoff.max
                ),
            ));
        }
        if let Some(success) = self.not_applied_statuses.iter().find(|s| s.is_success()) {
            return Err(BuildError::setting(
                "not_applied_statuses",
                format!("{success} is a success status: it proves the request was applied"),
            ));
        }
        if let Some(success) = self.retry_statuses.iter().find(|s| s.is_success()) {
            return Err(BuildError::setting(
                "retry_statuses",
                format!("{success} is a success status and cannot be retried"),
            ));
        }
        if self.deadline == Some(Duration::ZERO) {
            return Err(BuildError::setting("deadline", "it must be above zero"));
        }
        if self.attempt_timeout == Some(Duration::ZERO) {
            return Err(BuildError::setting(
                "attempt_timeout",
                "it must be above zero",
            ));
        }
        if self.replay_buffer > MAX_REPLAY_BUFFER {
            return Err(BuildError::setting(
                "replay_buffer",
                format!(
                    "{} bytes is over the 1 GiB a request may keep",
                    self.replay_buffer
                ),
            ));
        }
        let mut key_trust = KeyTrust {
            everywhere: self.honor_idempotency_key
                || (self.mint_idempotency_keys && self.key_hosts.is_empty()),
            hosts: Vec::new(),
            routes: RouteTable::default(),
        };
        for host in &self.key_hosts {
            key_trust.add_host(host)?;
        }
        for (method, template, honors) in self.key_routes {
            key_trust.add_route(method, &template, honors)?;
        }
        let mut routes = RouteTable::default();
        for (method, template, idempotency) in self.routes {
            routes.insert(method, &template, idempotency)?;
        }
        let mut host_routes = HostRoutes::default();
        for (host, method, template, idempotency) in self.host_routes {
            host_routes.insert(&host, method, &template, idempotency)?;
        }
        let budget: Option<Arc<dyn Budget + Send + Sync>> = match self.budget {
            BudgetChoice::LockFree {
                ttl,
                min_per_sec,
                retry_percent,
            } => Some(Arc::new(LockFreeBudget::new(
                ttl,
                min_per_sec,
                retry_percent,
            )?)),
            BudgetChoice::Tps {
                ttl,
                min_per_sec,
                retry_percent,
            } => {
                check_tps(ttl, min_per_sec, retry_percent)?;
                Some(Arc::new(TpsBudget::new(ttl, min_per_sec, retry_percent)))
            }
            BudgetChoice::Custom(budget) => Some(budget),
            BudgetChoice::Unlimited => None,
        };
        Ok(RetryPolicy {
            inner: Arc::new(Inner {
                max_retries: self.max_retries,
                routes,
                host_routes,
                key_trust,
                mint_idempotency_keys: self.mint_idempotency_keys,
                idempotency_key_header: self.idempotency_key_header,
                backoff: self.backoff,
                jitter: self.jitter,
                retry_statuses: self.retry_statuses.into_iter().collect::<StatusSet>(),
                not_applied_statuses: self.not_applied_statuses.into_iter().collect::<StatusSet>(),
                response_hook: self.response_hook,
                on_attempt: self.on_attempt,
                max_retry_after: self.max_retry_after,
                deadline: self.deadline,
                attempt_timeout: self.attempt_timeout,
                replay_buffer: self.replay_buffer,
                budget,
                should_retry_header: self.should_retry_header,
                replay_header: self.replay_header,
                request_id_header: self.request_id_header,
                attempt_header: self.attempt_header,
            }),
        })
    }
}

/// The bounds `TpsBudget::new` asserts, checked here so a bad value is an error, not a panic.
fn check_tps(ttl: Duration, min_per_sec: u32, retry_percent: f32) -> Result<(), BuildError> {
    if ttl < Duration::from_secs(1) || ttl > Duration::from_secs(60) {
        return Err(BuildError::setting(
            "tps_budget",
            format!("ttl {ttl:?} is outside 1 s to 60 s"),
        ));
    }
    if !(0.0..=1000.0).contains(&retry_percent) {
        return Err(BuildError::setting(
            "tps_budget",
            format!("retry_percent {retry_percent} is outside 0 to 1000"),
        ));
    }
    if min_per_sec >= i32::MAX as u32 {
        return Err(BuildError::setting(
            "tps_budget",
            format!("min_per_sec {min_per_sec} is not below {}", i32::MAX),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(b: RetryPolicyBuilder) -> BuildError {
        b.build().unwrap_err()
    }

    #[test]
    fn defaults_build() {
        let p = RetryPolicyBuilder::new().build().unwrap();
        let i = &p.inner;
        assert_eq!(i.max_retries, 2);
        assert_eq!(i.backoff.initial, Duration::from_millis(500));
        assert_eq!(i.backoff.max, Duration::from_secs(8));
        assert_eq!(i.max_retry_after, Duration::from_secs(60));
        assert_eq!(i.deadline, None);
        assert!(i.budget.is_some());
        let statuses: Vec<u16> = i.retry_statuses.iter().map(|s| s.as_u16()).collect();
        assert_eq!(statuses, [408, 429, 500, 502, 503, 504]);
    }

    #[test]
    fn backoff_initial_above_max() {
        let e =
            err(RetryPolicyBuilder::new().backoff(Duration::from_secs(10), Duration::from_secs(1)));
        assert_eq!(e.setting_name(), "backoff");
        assert!(e.to_string().contains("initial 10s is above max 1s"), "{e}");
    }

    #[test]
    fn budget_out_of_range() {
        let cases = [
            (Duration::from_millis(500), 10, 0.2, "ttl 500ms"),
            (Duration::from_secs(61), 10, 0.2, "ttl 61s"),
            (Duration::from_secs(10), 10, -0.1, "retry_percent -0.1"),
            (Duration::from_secs(10), 10, 1000.5, "retry_percent 1000.5"),
            (Duration::from_secs(10), 10, f32::NAN, "retry_percent NaN"),
            (
                Duration::from_secs(10),
                u32::MAX,
                0.2,
                "min_per_sec 4294967295",
            ),
        ];
        for (ttl, min, pct, needle) in cases {
            let e = err(RetryPolicyBuilder::new().tps_budget(ttl, min, pct));
            assert_eq!(e.setting_name(), "tps_budget");
            assert!(e.to_string().contains(needle), "{e}");
        }
    }

    #[test]
    fn lock_free_budget_out_of_range() {
        let cases = [
            (Duration::from_millis(500), 0.2, "ttl 500ms"),
            (Duration::from_secs(10), 1000.5, "retry_percent 1000.5"),
        ];
        for (ttl, pct, needle) in cases {
            let e = err(RetryPolicyBuilder::new().lock_free_budget(ttl, 10, pct));
            assert_eq!(e.setting_name(), "lock_free_budget");
            assert!(e.to_string().contains(needle), "{e}");
        }
        let b = RetryPolicyBuilder::new().lock_free_budget(Duration::from_secs(1), 0, 0.0);
        assert!(format!("{b:?}").contains("LockFreeBudget"));
        assert!(b.build().is_ok());
    }

    #[test]
    fn route_errors_name_the_rule() {
        let e = err(RetryPolicyBuilder::new()
            .route(Method::POST, "/v1/search", Idempotency::Idempotent)
            .route(Method::POST, "/v1/search", Idempotency::NonIdempotent));
        assert_eq!(
            e.to_string(),
            "invalid retry policy setting `route`: POST /v1/search: two rules for the same method and template"
        );
        let e = err(RetryPolicyBuilder::new().route(
            Method::GET,
            "/v1/{unclosed",
            Idempotency::Idempotent,
        ));
        assert!(e.to_string().contains("GET /v1/{unclosed"), "{e}");
    }

    #[test]
    fn other_bad_settings() {
        let e = err(RetryPolicyBuilder::new().max_retries(101));
        assert!(
            e.to_string().contains("101 is above the limit of 100"),
            "{e}"
        );
        let e = err(RetryPolicyBuilder::new().retry_statuses([StatusCode::OK]));
        assert!(e.to_string().contains("200 OK is a success status"), "{e}");
        let e = err(RetryPolicyBuilder::new().deadline(Duration::ZERO));
        assert_eq!(e.setting_name(), "deadline");
    }
}
