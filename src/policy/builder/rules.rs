//! The rules that decide whether a repeat is harmless: routes, hosts, trust in keys.

use super::*;

impl RetryPolicyBuilder {
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
        self.rules
            .routes
            .push((method, template.to_owned(), idempotency));
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
        self.rules
            .host_routes
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
        self.rules.honor_idempotency_key = honor;
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
        self.rules.key_hosts.push(host.to_owned());
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
        self.rules
            .key_routes
            .push((method, template.to_owned(), honors));
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
        self.rules.mint_idempotency_keys = mint;
        self
    }
}
