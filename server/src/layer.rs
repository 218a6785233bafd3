use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method};
use tower_layer::Layer;

use crate::mode::{Config, Scope};
use crate::observe::Observe;
use crate::renewal::Renewals;
use crate::service::IdempotencyService;
use crate::store::IdempotencyStore;

const YEAR: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// A server-side tower layer that honours `Idempotency-Key`: the first request with a key runs,
/// its response is stored and sent again to every repeat with the same key.
///
/// See the [crate docs](crate) for the protocol. Setters consume and return the layer; each
/// documents its default.
///
/// # Clone
///
/// Clones share the store (behind an `Arc`).
#[derive(Debug)]
pub struct IdempotencyLayer<St> {
    pub(crate) store: Arc<St>,
    pub(crate) config: Arc<Config>,
    /// Shared by every service this layer makes (servers often make one per connection): one
    /// ticker per runtime renews the claims of all of them.
    renewals: Arc<Renewals<St>>,
}

impl<St> Clone for IdempotencyLayer<St> {
    fn clone(&self) -> Self {
        IdempotencyLayer {
            store: self.store.clone(),
            config: self.config.clone(),
            renewals: self.renewals.clone(),
        }
    }
}

impl<St: IdempotencyStore> IdempotencyLayer<St> {
    /// A layer over `store` with the defaults below.
    pub fn new(store: St) -> Self {
        let store = Arc::new(store);
        let lease = Duration::from_secs(60);
        IdempotencyLayer {
            renewals: Arc::new(Renewals::new(store.clone(), lease, Observe::default())),
            store,
            config: Arc::new(Config {
                key_header: HeaderName::from_static("idempotency-key"),
                stored_response_header: HeaderName::from_static("idempotent-replayed"),
                ttl: Duration::from_secs(24 * 60 * 60),
                lease,
                store_server_errors: true,
                scope: None,
                max_request_bytes: 1024 * 1024,
                max_response_bytes: 64 * 1024,
                required: Vec::new(),
                observe: Observe::default(),
            }),
        }
    }

    /// Entries how the layer answers keyed requests, and its claims' lease renewals, in
    /// OpenTelemetry instruments made once from `meter`: keys claimed, repeats answered from
    /// the stored response, 409s while in flight, 422 reuses, 400s for malformed or missing
    /// keys, store errors (503). The crate docs' Metrics section lists each instrument
    /// with its unit and attributes; keys and paths are never attributes. For the global meter
    /// provider, hand over `opentelemetry::global::meter("tower-retry-safety")`.
    ///
    /// Defaults to none: nothing is counted.
    #[cfg(feature = "opentelemetry")]
    #[cfg_attr(docsrs, doc(cfg(feature = "opentelemetry")))]
    pub fn meter(self, meter: opentelemetry::metrics::Meter) -> Self {
        let observe = Observe::new(&meter);
        let mut layer = self.config(|c| c.observe = observe.clone());
        layer.renewals = Arc::new(Renewals::new(
            layer.store.clone(),
            layer.config.lease,
            observe,
        ));
        layer
    }

    /// The store, to inspect it (its size, a key's entry).
    pub fn store(&self) -> &St {
        &self.store
    }

    fn config(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(Arc::make_mut(&mut self.config));
        self
    }

    /// The header that carries the key.
    ///
    /// Defaults to `idempotency-key`.
    pub fn key_header(self, name: HeaderName) -> Self {
        self.config(|c| c.key_header = name)
    }

    /// The header set to `true` on a stored response sent again.
    ///
    /// Defaults to `idempotent-replayed`.
    pub fn stored_response_header(self, name: HeaderName) -> Self {
        self.config(|c| c.stored_response_header = name)
    }

    /// How long a key's completed outcome is kept. Values above a year are taken as a year.
    ///
    /// Defaults to 24 hours.
    pub fn ttl(self, ttl: Duration) -> Self {
        self.config(|c| c.ttl = ttl.min(YEAR))
    }

    /// How long a claim on a key lasts without renewal. While its handler runs, the layer
    /// renews the claim every quarter of the lease, at most a third apart (see the
    /// [crate docs](crate#leases-and-fencing) for what that asks of the handler), so a
    /// handler may run longer than it; a server that dies mid-handler holds its keys until the
    /// lease ends. After that a repeat of the key runs the handler again: the lease is the
    /// window within which a crashed server's write cannot be told from one that never started. Values under 30 ms are taken as 30 ms,
    /// above a year as a year.
    ///
    /// Defaults to 60 seconds.
    pub fn lease(self, lease: Duration) -> Self {
        let lease = lease.clamp(Duration::from_millis(30), YEAR);
        let mut layer = self.config(|c| c.lease = lease);
        let observe = layer.config.observe.clone();
        layer.renewals = Arc::new(Renewals::new(layer.store.clone(), lease, observe));
        layer
    }

    /// Whether a response with a 5xx status is stored (and sent again to repeats). Stored, a repeat learns the
    /// same outcome (a 500 may come after a write was partly applied); not stored, the key is
    /// freed and a repeat runs the handler again. Turn it off only for handlers that answer
    /// 5xx solely when they applied nothing (a transaction rolled back, a dependency refused
    /// before any effect): the layer takes that as the proof that the handler did not run.
    /// A gRPC handler's server errors count too: a trailers-only answer with a gRPC content
    /// type whose `grpc-status` maps to a 5xx (UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED,
    /// INTERNAL, UNAVAILABLE, DATA_LOSS), in every build.
    ///
    /// Defaults to true (Stripe's choice).
    pub fn store_server_errors(self, store: bool) -> Self {
        self.config(|c| c.store_server_errors = store)
    }

    /// Scope keys by who sent them: `scope` reads the sender's identity from the request —
    /// an authenticated tenant that an auth layer outside this one put in the request's
    /// extensions, say — and keys live in one space per scope, so one client can never be
    /// sent another client's stored response for presenting its key. A keyed request for
    /// which `scope` returns `None` is refused with 400 and runs nothing.
    ///
    /// Scope keys whenever several clients reach one server and keys are not unguessable
    /// secrets of one client (a key another client can learn or choose is a way to read its
    /// responses). Defaults to unscoped: one key space for all clients.
    ///
    /// ```
    /// use tower_idempotency_keys::{IdempotencyLayer, stores::MemoryStore};
    ///
    /// #[derive(Clone)]
    /// struct Tenant(String); // set by the auth layer
    ///
    /// let layer = IdempotencyLayer::new(MemoryStore::new())
    ///     .scope_keys_by(|req| req.extensions.get::<Tenant>().map(|t| t.0.clone()));
    /// # drop(layer);
    /// ```
    pub fn scope_keys_by(
        self,
        scope: impl Fn(&http::request::Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        let scope = Scope(Arc::new(scope));
        self.config(|c| c.scope = Some(scope))
    }

    /// Scope keys by the value of a request header (an API key id or an account header that
    /// an auth layer outside this one checked): see [`scope_keys_by`](Self::scope_keys_by).
    /// A keyed request without the header (or with a value that is not visible ASCII) is
    /// refused with 400.
    pub fn scope_keys_by_header(self, name: HeaderName) -> Self {
        self.scope_keys_by(move |req| {
            let value = req.headers.get(&name)?.to_str().ok()?;
            (!value.is_empty()).then(|| value.to_owned())
        })
    }

    /// The largest keyed request body read for the fingerprint; a larger one is refused with
    /// 413 before it runs.
    ///
    /// Defaults to 1 MiB.
    pub fn max_request_bytes(self, limit: usize) -> Self {
        self.config(|c| c.max_request_bytes = limit)
    }

    /// The largest response body stored. A larger response passes through whole to its
    /// client; repeats of its key get its status and headers with an empty body (the key is
    /// never freed: its handler ran), and a warn event says so.
    ///
    /// Defaults to 64 KiB.
    pub fn max_response_bytes(self, limit: usize) -> Self {
        self.config(|c| c.max_response_bytes = limit)
    }

    /// Methods whose requests must carry a key: one without gets 400 and does not run.
    ///
    /// Defaults to none (requests without a key pass through untouched).
    pub fn require_key_for(self, methods: impl IntoIterator<Item = Method>) -> Self {
        let methods: Vec<Method> = methods.into_iter().collect();
        self.config(|c| c.required = methods)
    }
}

#[cfg(feature = "postgres")]
impl IdempotencyLayer<crate::postgres::PostgresStore> {
    /// Atomic mode: the key is claimed inside a PostgreSQL transaction that the handler
    /// writes in, and its response commits in that same transaction. See
    /// [`AtomicLayer`](crate::postgres::atomic::AtomicLayer).
    /// Every setting of this layer carries over, except the lease (a transaction holds the
    /// key, not a lease).
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn atomic(self) -> crate::postgres::atomic::AtomicLayer {
        crate::postgres::atomic::AtomicLayer::new((*self.store).clone(), self.config)
    }
}

impl<S, St> Layer<S> for IdempotencyLayer<St> {
    type Service = IdempotencyService<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            config: self.config.clone(),
            renewals: self.renewals.clone(),
        }
    }
}
