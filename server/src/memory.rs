use std::collections::HashMap;
use std::future::{ready, Future};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::store::{
    Begin, Entry, FencingToken, Fingerprint, IdempotencyStore, StoreError, StoredResponse,
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
    entries: Entries,
    bytes: usize,
}

/// A key's entry. The response is kept inline rather than boxed: a box is one more allocation
/// per key that outlives the request, which costs more than the larger table
/// (`benches/server/` of this package measures it).
#[derive(Debug)]
struct Slot {
    fingerprint: Fingerprint,
    holds: Holds,
    /// The end of an in-flight entry's lease, or of a completed entry's TTL.
    expires: Instant,
    size: usize,
}

#[derive(Debug)]
enum Holds {
    /// In flight under this claim.
    Claimed(FencingToken),
    Completed(StoredResponse),
}

impl Slot {
    fn entry(&self) -> Entry {
        let fingerprint = self.fingerprint;
        match &self.holds {
            Holds::Claimed(_) => Entry::InFlight { fingerprint },
            Holds::Completed(response) => Entry::Completed {
                fingerprint,
                response: StoredResponse::clone(response),
            },
        }
    }
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
        // A panic elsewhere while holding the lock leaves consistent data: nothing that can
        // panic runs between the parts of one update.
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

    /// The slot of `key` if it has not expired. One lookup: an expired slot is left in place
    /// (evicted later, or overwritten by the next claim of its key).
    fn live(&mut self, key: &str, now: Instant) -> Option<&mut Slot> {
        live(&mut self.entries, key, now)
    }

    /// The in-flight slot held under `token`, or `fenced`.
    fn held(
        &mut self,
        key: &str,
        token: FencingToken,
        now: Instant,
    ) -> Result<&mut Slot, StoreError> {
        held(&mut self.entries, key, token, now)
    }
}

type Entries = HashMap<Box<str>, Slot>;

fn live<'a>(entries: &'a mut Entries, key: &str, now: Instant) -> Option<&'a mut Slot> {
    entries.get_mut(key).filter(|s| s.expires > now)
}

fn held<'a>(
    entries: &'a mut Entries,
    key: &str,
    token: FencingToken,
    now: Instant,
) -> Result<&'a mut Slot, StoreError> {
    match live(entries, key, now) {
        Some(slot) if matches!(slot.holds, Holds::Claimed(c) if c == token) => Ok(slot),
        _ => Err(StoreError::fenced()),
    }
}

/// Whether the claim with `token` may complete `key`: the key is held under `token` (its lease
/// may have run out), or nothing live (the lease ran out and no other claim took the key since:
/// the handler ran, and its response is stored rather than lost). `Some(size)` of the slot the entry replaces.
fn completable(
    entries: &Entries,
    key: &str,
    token: FencingToken,
    now: Instant,
) -> Result<Option<usize>, StoreError> {
    match entries.get(key) {
        Some(slot) if matches!(slot.holds, Holds::Claimed(c) if c == token) => Ok(Some(slot.size)),
        Some(slot) if slot.expires > now => Err(StoreError::fenced()),
        Some(slot) => Ok(Some(slot.size)),
        None => Ok(None),
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

/// Every call is done at once, under the lock: the store's futures are ready values, and a
/// keyed request's future does not have to make room for their arguments.
impl MemoryStore {
    fn begin_now(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Result<Begin, StoreError> {
        use std::collections::hash_map::Entry as Vacancy;
        let now = Instant::now();
        let mut state = self.lock();
        let size = key_size(key);
        let token = FencingToken::new();
        let slot = Slot {
            fingerprint,
            holds: Holds::Claimed(token),
            expires: later(now, lease),
            size,
        };
        // One lookup in the common case (a fresh key): the key's box is made up front, as the
        // insert needs it.
        let state = &mut *state;
        let count = state.entries.len();
        let vacant = match state.entries.entry(key.into()) {
            Vacancy::Occupied(mut taken) => {
                let old = taken.get_mut();
                if old.expires > now {
                    return Ok(Begin::Existing(old.entry()));
                }
                // Expired: the claim takes its place (the same key, so never more bytes).
                state.bytes = state.bytes - old.size + size;
                *old = slot;
                return Ok(Begin::Started(token));
            }
            Vacancy::Vacant(vacant) => vacant,
        };
        if count >= self.max_entries || state.bytes + size > self.max_bytes {
            let key = vacant.into_key();
            state.evict_expired(now);
            if state.entries.len() >= self.max_entries || state.bytes + size > self.max_bytes {
                return Err(StoreError::full());
            }
            state.bytes += size;
            state.entries.insert(key, slot);
            return Ok(Begin::Started(token));
        }
        state.bytes += size;
        vacant.insert(slot);
        Ok(Begin::Started(token))
    }

    fn renew_now(&self, key: &str, token: FencingToken, lease: Duration) -> Result<(), StoreError> {
        let now = Instant::now();
        self.lock().held(key, token, now)?.expires = later(now, lease);
        Ok(())
    }

    fn complete_now(
        &self,
        key: &str,
        token: FencingToken,
        fingerprint: Fingerprint,
        response: StoredResponse,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        // Made before the lock is taken: no allocation while it is held.
        let size = key_size(key) + response.size();
        let stored = response.with_own_body();
        let now = Instant::now();
        let mut state = self.lock();
        let state = &mut *state;
        // The entry takes the key only if it fits: an entry that does not fit leaves the key
        // as it is (in flight until its lease ends), never free early.
        let fits = |state: &State, replaced: Option<usize>| {
            state.bytes - replaced.unwrap_or(0) + size <= self.max_bytes
                && (replaced.is_some() || state.entries.len() < self.max_entries)
        };
        let mut replaced = completable(&state.entries, key, token, now)?;
        if !fits(state, replaced) {
            state.evict_expired(now);
            replaced = completable(&state.entries, key, token, now)?;
            if !fits(state, replaced) {
                return Err(StoreError::full());
            }
        }
        // Everything that could fail is done.
        state.bytes = state.bytes - replaced.unwrap_or(0) + size;
        let slot = Slot {
            fingerprint,
            holds: Holds::Completed(stored),
            expires: later(now, ttl),
            size,
        };
        match state.entries.get_mut(key) {
            Some(old) => *old = slot,
            None => {
                state.entries.insert(key.into(), slot);
            }
        }
        Ok(())
    }

    fn get_now(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        let now = Instant::now();
        Ok(self.lock().live(key, now).map(|s| s.entry()))
    }

    fn release_now(&self, key: &str, token: FencingToken) -> Result<(), StoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        state.held(key, token, now)?;
        state.remove(key);
        Ok(())
    }
}

impl IdempotencyStore for MemoryStore {
    fn begin(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send {
        ready(self.begin_now(key, fingerprint, lease))
    }

    fn renew(
        &self,
        key: &str,
        token: FencingToken,
        lease: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        ready(self.renew_now(key, token, lease))
    }

    fn complete(
        &self,
        key: &str,
        token: FencingToken,
        fingerprint: Fingerprint,
        response: StoredResponse,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        ready(self.complete_now(key, token, fingerprint, response, ttl))
    }

    fn get(&self, key: &str) -> impl Future<Output = Result<Option<Entry>, StoreError>> + Send {
        ready(self.get_now(key))
    }

    fn release(
        &self,
        key: &str,
        token: FencingToken,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        ready(self.release_now(key, token))
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

    async fn claim(s: &MemoryStore, key: &str, lease: Duration) -> FencingToken {
        match s.begin(key, fp(1), lease).await.unwrap() {
            Begin::Started(token) => token,
            other => panic!("expected a claim, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_that_does_not_fit_leaves_the_key_in_flight() {
        let s = MemoryStore::with_limits(100, 1000);
        let c = claim(&s, "k", TTL).await;
        assert!(s
            .complete("k", c, fp(1), response(2000), TTL)
            .await
            .unwrap_err()
            .is_full());
        assert_eq!(
            s.get("k").await.unwrap(),
            Some(Entry::InFlight { fingerprint: fp(1) }),
            "a response that does not fit leaves the key in flight, never free"
        );
        assert_eq!(s.bytes(), key_size("k"));
        s.complete("k", c, fp(1), response(100), TTL).await.unwrap();
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
