use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method};
use tower_layer::Layer;

use super::{IdempotencyService, IdempotencyStore};

#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) key_header: HeaderName,
    pub(crate) replay_header: HeaderName,
    pub(crate) ttl: Duration,
    pub(crate) max_request_bytes: usize,
    pub(crate) max_response_bytes: usize,
    pub(crate) required: Vec<Method>,
}

/// A server-side tower layer that honours `Idempotency-Key`: the first request with a key runs,
/// its response is stored and replayed to every repeat with the same key.
///
/// See the [module docs](super) for the protocol. Setters consume and return the layer; each
/// documents its default.
///
/// # Clone
///
/// Clones share the store (behind an `Arc`).
#[derive(Debug)]
pub struct IdempotencyLayer<St> {
    store: Arc<St>,
    config: Arc<Config>,
}

impl<St> Clone for IdempotencyLayer<St> {
    fn clone(&self) -> Self {
        IdempotencyLayer {
            store: self.store.clone(),
            config: self.config.clone(),
        }
    }
}

impl<St: IdempotencyStore> IdempotencyLayer<St> {
    /// A layer over `store` with the defaults below.
    pub fn new(store: St) -> Self {
        IdempotencyLayer {
            store: Arc::new(store),
            config: Arc::new(Config {
                key_header: HeaderName::from_static("idempotency-key"),
                replay_header: HeaderName::from_static("idempotent-replayed"),
                ttl: Duration::from_secs(24 * 60 * 60),
                max_request_bytes: 1024 * 1024,
                max_response_bytes: 64 * 1024,
                required: Vec::new(),
            }),
        }
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

    /// The header set to `true` on a replayed response.
    ///
    /// Defaults to `idempotent-replayed`.
    pub fn replay_header(self, name: HeaderName) -> Self {
        self.config(|c| c.replay_header = name)
    }

    /// How long a key and its response are kept.
    ///
    /// Defaults to 24 hours.
    pub fn ttl(self, ttl: Duration) -> Self {
        self.config(|c| c.ttl = ttl)
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

impl<S, St> Layer<S> for IdempotencyLayer<St> {
    type Service = IdempotencyService<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            store: self.store.clone(),
            config: self.config.clone(),
        }
    }
}
