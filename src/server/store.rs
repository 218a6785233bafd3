use std::fmt;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};

use crate::BoxError;

/// What identifies "the same request" for a key: method, path and body, hashed with a hash
/// that is stable across processes and versions (FNV-1a, 64 bits), so a store shared by a
/// fleet compares fingerprints made by different servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fingerprint(u64);

impl Fingerprint {
    /// The fingerprint of a request.
    pub fn of(method: &http::Method, path: &str, body: &[u8]) -> Self {
        const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let mut hash = OFFSET;
        for part in [
            method.as_str().as_bytes(),
            b"\0",
            path.as_bytes(),
            b"\0",
            body,
        ] {
            for &b in part {
                hash ^= u64::from(b);
                hash = hash.wrapping_mul(PRIME);
            }
        }
        Fingerprint(hash)
    }

    /// The hash, to store it.
    pub fn as_u64(self) -> u64 {
        self.0
    }

    /// A fingerprint read back from a store.
    pub fn from_u64(value: u64) -> Self {
        Fingerprint(value)
    }
}

/// A response kept for replay: status, headers and the whole body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResponse {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl StoredResponse {
    /// A response to keep.
    pub fn new(status: StatusCode, headers: HeaderMap, body: Bytes) -> Self {
        StoredResponse {
            status,
            headers,
            body,
        }
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

    /// Roughly how much memory the record holds, for stores that bound it.
    pub fn size(&self) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 32)
            .sum();
        self.body.len() + headers + 64
    }
}

/// What a store holds for a key.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// The first request with this key is still running.
    InFlight {
        /// The first request's fingerprint.
        fingerprint: Fingerprint,
    },
    /// The first request finished with this response.
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
    /// The key was free; it is now in flight for this caller, who must `complete` or
    /// `release` it.
    Started,
    /// The key is taken.
    Existing(Entry),
}

/// A store that cannot serve a call. The layer answers 503 (nothing was applied) and never
/// runs the request without the store's guarantee.
#[derive(Debug)]
pub struct StoreError {
    full: bool,
    source: BoxError,
}

impl StoreError {
    /// A failure of the store's backend (a lost connection, a timeout).
    pub fn new(source: impl Into<BoxError>) -> Self {
        StoreError {
            full: false,
            source: source.into(),
        }
    }

    /// The store is at its capacity and nothing could be evicted.
    pub fn full() -> Self {
        StoreError {
            full: true,
            source: "the idempotency store is full".into(),
        }
    }

    /// Whether the store refused because it is full.
    pub fn is_full(&self) -> bool {
        self.full
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.full {
            f.write_str("the idempotency store is full")
        } else {
            f.write_str("the idempotency store failed")
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        if self.full {
            None
        } else {
            Some(&*self.source)
        }
    }
}

/// Where [`IdempotencyLayer`](super::IdempotencyLayer) keeps keys and responses.
///
/// Designed so that a shared store (Redis, a database) can back a fleet of servers: each call
/// is one atomic operation on one key — `begin` is an insert-if-absent (`SET NX` with expiry),
/// `complete` a conditional overwrite, `release` a delete — and records hold plain data
/// ([`Fingerprint::as_u64`], [`StoredResponse`]) that serialise easily.
/// [`MemoryStore`](super::MemoryStore) is the embedded one.
pub trait IdempotencyStore: Send + Sync + 'static {
    /// Atomically: if `key` is free, mark it in flight with `fingerprint` for `ttl` and return
    /// [`Begin::Started`]; otherwise return what it holds.
    fn begin(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        ttl: Duration,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send;

    /// Record the response of the request that started `key`, kept for `ttl`.
    fn complete(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        response: StoredResponse,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// What the store holds for `key`, if anything (expired entries are absent).
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<Entry>, StoreError>> + Send;

    /// Free `key`: the request that started it produced nothing to keep.
    fn release(&self, key: &str) -> impl Future<Output = Result<(), StoreError>> + Send;
}
