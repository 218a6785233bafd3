use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::store::{
    Begin, Claim, Entry, Fingerprint, IdempotencyStore, StoreError, StoredResponse,
};

/// The embedded [`IdempotencyStore`]: a map behind a mutex, bounded in entries and in bytes,
/// with expiry.
///
/// Defaults: at most 4096 keys and 32 MiB of stored responses. A full store first evicts
/// expired entries; if none has expired it refuses new keys (the layer answers 503, so nothing
/// runs unguarded) and refuses to keep a response that does not fit (the layer then keeps the
/// response's status and headers, or else holds the key in flight and tries again until its
/// TTL: a key whose handler ran is never freed). Its memory stays bounded whatever clients
/// send — and a client that fills it with keys locks out every keyed write until its entries
/// expire (503s): size it for your key rate times the TTL.
///
/// Keys live in one process: for a fleet of servers behind a load balancer, implement the
/// trait over a shared store.
#[derive(Debug)]
pub struct MemoryStore {
    state: Mutex<State>,
    max_entries: usize,
    max_bytes: usize,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<Box<str>, Slot>,
    bytes: usize,
}

#[derive(Debug)]
struct Slot {
    entry: Entry,
    /// The claim that holds an in-flight entry.
    claim: Option<Claim>,
    /// The end of an in-flight entry's lease, or of a completed entry's TTL.
    expires: Instant,
    size: usize,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A store with the defaults: 4096 keys, 32 MiB.
    pub fn new() -> Self {
        Self::with_limits(4096, 32 * 1024 * 1024)
    }

    /// A store of at most `max_entries` keys and `max_bytes` of stored responses (keys
    /// included).
    pub fn with_limits(max_entries: usize, max_bytes: usize) -> Self {
        MemoryStore {
            state: Mutex::default(),
            max_entries,
            max_bytes,
        }
    }

    /// How many keys it holds, expired ones included until they are evicted.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether it holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes it accounts for.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves consistent data: every update is
        // a single insert or remove.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl State {
    fn remove(&mut self, key: &str) -> Option<Slot> {
        let slot = self.entries.remove(key)?;
        self.bytes -= slot.size;
        Some(slot)
    }

    fn evict_expired(&mut self, now: Instant) {
        let before = self.entries.len();
        let mut freed = 0;
        self.entries.retain(|_, slot| {
            let keep = slot.expires > now;
            if !keep {
                freed += slot.size;
            }
            keep
        });
        self.bytes -= freed;
        if self.entries.len() != before {
            tracing::debug!(
                evicted = before - self.entries.len(),
                "idempotency store evicted expired keys"
            );
        }
    }

    fn live(&mut self, key: &str, now: Instant) -> Option<&mut Slot> {
        if self.entries.get(key).is_some_and(|s| s.expires <= now) {
            self.remove(key);
        }
        self.entries.get_mut(key)
    }

    /// The in-flight slot that `claim` holds, or `fenced`.
    fn held(&mut self, key: &str, claim: Claim, now: Instant) -> Result<&mut Slot, StoreError> {
        match self.live(key, now) {
            Some(slot) if slot.claim == Some(claim) => Ok(slot),
            _ => Err(StoreError::fenced()),
        }
    }
}

/// `now + d`, saturating far in the future instead of overflowing (a "keep forever" TTL).
fn later(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 60 * 60))
}

fn key_size(key: &str) -> usize {
    key.len() + 64
}

impl IdempotencyStore for MemoryStore {
    async fn begin(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Result<Begin, StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        if let Some(slot) = state.live(key, now) {
            return Ok(Begin::Existing(slot.entry.clone()));
        }
        let size = key_size(key);
        if state.entries.len() >= self.max_entries || state.bytes + size > self.max_bytes {
            state.evict_expired(now);
            if state.entries.len() >= self.max_entries || state.bytes + size > self.max_bytes {
                return Err(StoreError::full());
            }
        }
        let claim = Claim::new();
        state.bytes += size;
        state.entries.insert(
            key.into(),
            Slot {
                entry: Entry::InFlight { fingerprint },
                claim: Some(claim),
                expires: later(now, lease),
                size,
            },
        );
        Ok(Begin::Started(claim))
    }

    async fn renew(&self, key: &str, claim: Claim, lease: Duration) -> Result<(), StoreError> {
        let now = Instant::now();
        self.lock().held(key, claim, now)?.expires = later(now, lease);
        Ok(())
    }

    async fn complete(
        &self,
        key: &str,
        claim: Claim,
        response: StoredResponse,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        let slot = state.held(key, claim, now)?;
        let Entry::InFlight { fingerprint } = slot.entry else {
            return Err(StoreError::fenced());
        };
        // The record replaces the in-flight slot only if it fits: a record that does not fit
        // leaves the key in flight, never free (its request's handler ran).
        let held = slot.size;
        let size = key_size(key) + response.size();
        if state.bytes - held + size > self.max_bytes {
            state.evict_expired(now);
            if state.bytes - held + size > self.max_bytes {
                return Err(StoreError::full());
            }
        }
        // Everything that could fail is done: the swap below is one remove and one insert.
        let slot = Slot {
            entry: Entry::Completed {
                fingerprint,
                response,
            },
            claim: None,
            expires: later(now, ttl),
            size,
        };
        state.remove(key);
        state.bytes += size;
        state.entries.insert(key.into(), slot);
        Ok(())
    }

    async fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        let now = Instant::now();
        Ok(self.lock().live(key, now).map(|s| s.entry.clone()))
    }

    async fn release(&self, key: &str, claim: Claim) -> Result<(), StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        state.held(key, claim, now)?;
        state.remove(key);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http::{HeaderMap, StatusCode};

    const TTL: Duration = Duration::from_secs(60);

    fn fp(n: u8) -> Fingerprint {
        Fingerprint::from_bytes([n; 32])
    }

    fn response(len: usize) -> StoredResponse {
        StoredResponse::new(
            StatusCode::OK,
            HeaderMap::new(),
            Bytes::from(vec![b'x'; len]),
        )
    }

    async fn claim(s: &MemoryStore, key: &str, lease: Duration) -> Claim {
        match s.begin(key, fp(1), lease).await.unwrap() {
            Begin::Started(claim) => claim,
            other => panic!("expected a claim, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_that_does_not_fit_leaves_the_key_in_flight() {
        let s = MemoryStore::with_limits(100, 1000);
        let c = claim(&s, "k", TTL).await;
        assert!(s
            .complete("k", c, response(2000), TTL)
            .await
            .unwrap_err()
            .is_full());
        assert_eq!(
            s.get("k").await.unwrap(),
            Some(Entry::InFlight { fingerprint: fp(1) }),
            "a response that does not fit leaves the key in flight, never free"
        );
        assert_eq!(s.bytes(), key_size("k"));
        s.complete("k", c, response(100), TTL).await.unwrap();
        assert!(s.bytes() <= 1000);
    }

    #[tokio::test(start_paused = true)]
    async fn bounded_in_entries_then_evicts_expired() {
        let s = MemoryStore::with_limits(2, usize::MAX);
        claim(&s, "a", Duration::from_secs(1)).await;
        claim(&s, "b", TTL).await;
        assert!(s.begin("c", fp(1), TTL).await.unwrap_err().is_full());
        tokio::time::advance(Duration::from_secs(2)).await;
        claim(&s, "c", TTL).await;
        assert_eq!(s.len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn many_clients_cannot_grow_it() {
        let s = MemoryStore::with_limits(64, 64 * 1024);
        for i in 0..10_000 {
            let _ = s.begin(&format!("key-{i}"), fp(1), TTL).await;
        }
        assert_eq!(s.len(), 64);
        assert!(s.bytes() <= 64 * 1024);
    }
}
