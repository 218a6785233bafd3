use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use sha2::{Digest, Sha256};

use tower_retry_safety::BoxError;

/// What identifies "the same request" for a key: SHA-256 over the method, the path with its
/// query, and the body. Stable across processes and versions, so a store shared by a fleet
/// compares fingerprints made by different servers, and collision-resistant, so no client can
/// craft a different request that passes for the first.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of a request: `path_and_query` is the request target as sent (the
    /// query takes part: `?amount=5` and `?amount=500` differ).
    pub fn of(method: &http::Method, path_and_query: &str, body: &[u8]) -> Self {
        let mut hash = Sha256::new();
        // Lengths first, so no two different requests hash the same bytes.
        for part in [method.as_str().as_bytes(), path_and_query.as_bytes(), body] {
            hash.update((part.len() as u64).to_be_bytes());
            hash.update(part);
        }
        Fingerprint(hash.finalize().into())
    }

    /// The hash, to store it.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A fingerprint read back from a store.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Fingerprint(bytes)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A prefix is enough to tell two apart in a log.
        write!(f, "Fingerprint(")?;
        for b in &self.0[..6] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…)")
    }
}

/// The fencing token of a claim on a key: only the holder of the claim that currently holds
/// the key may renew, complete or release it; the token of a claim that was taken over (its
/// lease ended and another request claimed the key) is refused, so a stale server never
/// overwrites a newer stored response.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// A fresh token. Tokens never repeat within a process (a counter through a bijective
    /// mix) and differ across processes (a random seed drawn once), without a system call per
    /// claim.
    pub fn new() -> Self {
        static SEED: OnceLock<u64> = OnceLock::new();
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let seed = *SEED.get_or_init(|| {
            let (high, low) = uuid::Uuid::new_v4().as_u64_pair();
            high ^ low
        });
        FencingToken(mix(seed.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed))))
    }

    /// The token, to store it.
    pub fn token(self) -> u64 {
        self.0
    }

    /// A token read back from a store.
    pub fn from_token(token: u64) -> Self {
        FencingToken(token)
    }
}

/// SplitMix64's finaliser: a bijection on `u64`, so distinct inputs give distinct tokens.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Default for FencingToken {
    fn default() -> Self {
        Self::new()
    }
}

/// A stored response: status, headers and the whole body, kept for the key's repeats.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResponse {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
    /// Boxed: most responses have none, and the entry stays small in the stores' maps.
    trailers: Option<Box<HeaderMap>>,
}

impl StoredResponse {
    /// A response to keep.
    pub fn new(status: StatusCode, headers: HeaderMap, body: Bytes) -> Self {
        StoredResponse {
            status,
            headers,
            body,
            trailers: None,
        }
    }

    /// The response with the trailers its body ended with (a gRPC response's `grpc-status`),
    /// sent again after the body.
    pub fn with_trailers(mut self, trailers: HeaderMap) -> Self {
        self.trailers = Some(Box::new(trailers));
        self
    }

    /// The trailers, if the body ended with some.
    pub fn trailers(&self) -> Option<&HeaderMap> {
        self.trailers.as_deref()
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The body.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The entry with a body and header values of its own. A body the layer did not copy (one
    /// chunk, as the handler gave it) may be a slice of a larger buffer, and hyper's parser
    /// makes each header value a slice of the connection's read buffer (a proxied upstream's
    /// response): a store that bounds its memory by their lengths copies them before keeping
    /// them, or a 12-byte header could keep a whole read buffer alive.
    pub(crate) fn with_own_body(mut self) -> Self {
        self.body = Bytes::copy_from_slice(&self.body);
        let trailers = self.trailers.iter_mut().flat_map(|t| t.values_mut());
        for value in self.headers.values_mut().chain(trailers) {
            if let Ok(own) = HeaderValue::from_bytes(value.as_bytes()) {
                let sensitive = value.is_sensitive();
                *value = own;
                value.set_sensitive(sensitive);
            }
        }
        self
    }

    /// Roughly how much memory the entry holds, for stores that bound it.
    pub fn size(&self) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .chain(self.trailers.iter().flat_map(|t| t.iter()))
            .map(|(k, v)| k.as_str().len() + v.len() + 32)
            .sum();
        self.body.len() + headers + 64
    }
}

/// What a store holds for a key.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// A request with this key is running under a claim whose lease has not ended.
    InFlight {
        /// The claiming request's fingerprint.
        fingerprint: Fingerprint,
    },
    /// The claiming request finished with this response.
    Completed {
        /// The first request's fingerprint.
        fingerprint: Fingerprint,
        /// Its response.
        response: StoredResponse,
    },
}

/// The outcome of [`IdempotencyStore::begin`].
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Begin {
    /// The key was free (absent, or its last claim's lease had ended); it is now in flight
    /// under this claim, whose holder must renew it while it runs and then `complete` it (or
    /// `release` it if its handler never ran).
    Started(FencingToken),
    /// The key is taken.
    Existing(Entry),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StoreErrorKind {
    Backend,
    Full,
    Fenced,
}

/// A store that cannot serve a call. On `begin` the layer answers 503 (nothing was applied)
/// and never runs the request without the store's guarantee.
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    source: Option<BoxError>,
}

impl StoreError {
    /// A failure of the store's backend (a lost connection, a timeout, an entry it cannot
    /// read).
    pub fn new(source: impl Into<BoxError>) -> Self {
        StoreError {
            kind: StoreErrorKind::Backend,
            source: Some(source.into()),
        }
    }

    /// The store is at its capacity and nothing could be evicted.
    pub fn full() -> Self {
        StoreError {
            kind: StoreErrorKind::Full,
            source: None,
        }
    }

    /// The claim no longer holds the key: its lease ended and the key was freed or claimed
    /// again. The call changed nothing.
    pub fn fenced() -> Self {
        StoreError {
            kind: StoreErrorKind::Fenced,
            source: None,
        }
    }

    /// Whether the store refused because it is full.
    pub fn is_full(&self) -> bool {
        self.kind == StoreErrorKind::Full
    }

    /// Whether the call was refused because its claim no longer holds the key.
    pub fn is_fenced(&self) -> bool {
        self.kind == StoreErrorKind::Fenced
    }
}

/// A store error's cause, for logs: `StoreError`'s own `Display` says only which kind.
pub(crate) fn cause(err: &StoreError) -> Option<String> {
    std::error::Error::source(err).map(ToString::to_string)
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.kind {
            StoreErrorKind::Backend => "the idempotency store failed",
            StoreErrorKind::Full => "the idempotency store is full",
            StoreErrorKind::Fenced => "the claim on this idempotency key was taken over",
        })
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Where [`IdempotencyLayer`](crate::layer::IdempotencyLayer) keeps keys and responses.
///
/// Shaped for a store shared by a fleet of servers: each call is one atomic operation on one
/// key, over any store with an atomic insert-if-absent with expiry and a compare-and-set.
///
/// - `begin` claims a free key (insert-if-absent, expiring after the **lease**) under a fresh
///   [`FencingToken`] (its fencing token), or returns what the key holds. A key whose lease ended
///   without a completion is free again: a server that crashed mid-handler holds its keys
///   no longer than its lease.
/// - `renew` and `release` are compare-and-set on the fencing token: they act only if the
///   key is still in flight under that very token, and otherwise fail with [`StoreError::fenced`]
///   and change nothing. `complete` also acts on a key that nothing holds any more (the
///   claim's lease ran out and no other claim took the key since): the handler ran, and its
///   response must be stored, not lost so that a repeat runs it again.
///
/// [`MemoryStore`](crate::memory::MemoryStore) is the embedded store; `RedisStore` (feature `redis`)
/// the shared one.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an idempotency store",
    label = "`IdempotencyLayer::new` takes a store",
    note = "use `tower_idempotency_keys::stores::MemoryStore::new()` in one process, or `RedisStore::connect(url).await?` (feature `redis`) or `PostgresStore` (feature `postgres`) for a fleet; or implement `IdempotencyStore` for your own store"
)]
pub trait IdempotencyStore: Send + Sync + 'static {
    /// Atomically: if `key` is free, mark it in flight with `fingerprint` under a fresh claim
    /// for `lease` and return [`Begin::Started`]; otherwise return what it holds.
    fn begin(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send;

    /// Extend the lease of the claim whose fencing token is `token` on `key` to `lease` from
    /// now, if that claim still holds the key.
    fn renew(
        &self,
        key: &str,
        token: FencingToken,
        lease: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Store the response of the request that claimed `key` with `token` (and
    /// `fingerprint`), kept for `ttl`, if that claim still holds the key or nothing does (its
    /// lease ran out and no other claim took the key since: the response is kept, not lost).
    /// If another claim, or an entry another claim completed, holds the key, fail with
    /// [`StoreError::fenced`] and change nothing. The entry this very claim completed may be
    /// written again or refused as fenced: a store that confirms its writes apart from them
    /// (`RedisStore` waiting for replicas) writes it again, so that a completion it could not
    /// confirm is sent again — on a new primary after a failover, where the key may still
    /// hold the claim.
    fn complete(
        &self,
        key: &str,
        token: FencingToken,
        fingerprint: Fingerprint,
        response: StoredResponse,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// What the store holds for `key`, if anything (expired entries are absent).
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<Entry>, StoreError>> + Send;

    /// Free `key`, if the claim whose fencing token is `token` still holds it: its handler never ran (or produced nothing the
    /// layer keeps), so a repeat may run it.
    fn release(
        &self,
        key: &str,
        token: FencingToken,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}
