//! Keeping a claim alive: renewing its lease while the handler runs, on a schedule of its own,
//! and holding the key while an outcome that the store refused is tried again. A claim whose
//! lease lapses after its handler ran would free the key, so neither may be left to chance.
//!
//! Renewal does not depend on how the handler yields: one task per layer (the *ticker*) wakes
//! on its own timer every twelfth of the lease, and renews each claim that has held its key
//! for a quarter of the lease since it was claimed or last renewed. Time is counted in the
//! ticker's ticks, read from its clock when it wakes: a claim reads the count before it asks
//! the store (no clock read of its own, and a slow reply from the store eats none of the
//! margin), and a ticker that woke late still renews every claim that fell due meanwhile.
//! Registering a claim is a push under a lock; a claim that ends before its first renewal
//! (most do) costs nothing more: no task, no timer of its own. The queue keeps an entry of 24
//! bytes per claim until it would have been due (a quarter lease).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use super::claim::Claimed;
use super::store::{Claim, IdempotencyStore, StoredResponse};
use crate::target::cap;

/// The ticker wakes this many times per lease.
const TICKS: u32 = 12;
/// A claim is renewed once this many ticks (a quarter of the lease) have begun since it was
/// claimed or last renewed: so at most a third of the lease after (the count is read at the
/// start of a tick), and, with a ticker that wakes on time, at least a sixth.
const EVERY: u64 = 3;

/// The claims of one layer that are held while their handlers run, and the ticker that
/// renews them.
pub(crate) struct Renewals<St> {
    store: Arc<St>,
    lease: Duration,
    /// A twelfth of the lease.
    tick: Duration,
    held: Mutex<Held>,
    /// Ticks begun since the first ticker started, as of the ticker's last wake: a claim reads
    /// it before it asks the store, so its count is never later than its claim.
    ticks: AtomicU64,
    /// A ticker task is alive (cleared by the ticker as it ends, even when its runtime drops
    /// it).
    ticking: AtomicBool,
}

/// Claims in flight: a slot each, and when each falls due.
#[derive(Default)]
struct Held {
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    /// `(due tick, slot, serial)`, soonest first. An ended claim's entry stays until it is
    /// due, and is skipped then (its slot was freed or reused: the serial tells).
    due: BinaryHeap<Reverse<(u64, usize, u64)>>,
    serial: u64,
    /// What tick 0 began at: set by the first ticker, kept by the ones after it.
    epoch: Option<Instant>,
}

struct Slot {
    key: Arc<str>,
    shown: Arc<str>,
    claim: Claim,
    serial: u64,
}

impl<St> std::fmt::Debug for Renewals<St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renewals")
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl<St> Renewals<St> {
    pub(crate) fn new(store: Arc<St>, lease: Duration) -> Self {
        Renewals {
            store,
            lease,
            tick: (lease / TICKS).max(Duration::from_millis(1)),
            held: Mutex::new(Held::default()),
            ticks: AtomicU64::new(0),
            ticking: AtomicBool::new(false),
        }
    }
}

impl<St: IdempotencyStore> Renewals<St> {
    pub(crate) fn store(&self) -> &Arc<St> {
        &self.store
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        // A panic while the lock is held leaves the slots consistent (each change is one push
        // or one take): a poisoned lock is still usable.
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The tick count to pass to [`hold`](Self::hold), read before the store is asked.
    pub(crate) fn now(&self) -> Tick {
        Tick(self.ticks.load(Ordering::Acquire))
    }

    /// Holds `claim` on `key` (asked of the store at `sent`) until the returned guard is
    /// stopped or dropped, renewing its lease meanwhile. `Err` on a runtime without a timer,
    /// where the ticker cannot run (the claim may still be released: nothing ran). Outside a
    /// runtime nothing is renewed.
    pub(crate) fn hold(
        self: &Arc<Self>,
        c: &Claimed<St>,
        sent: Tick,
    ) -> Result<Renewal<St>, NoTimer> {
        let mut held = self.lock();
        let serial = held.serial;
        held.serial += 1;
        let slot = Slot {
            key: c.key.clone(),
            shown: c.shown.clone(),
            claim: c.claim,
            serial,
        };
        let index = match held.free.pop() {
            Some(i) => {
                held.slots[i] = Some(slot);
                i
            }
            None => {
                held.slots.push(Some(slot));
                held.slots.len() - 1
            }
        };
        held.due.push(Reverse((sent.0 + EVERY, index, serial)));
        drop(held);
        let mut renewal = Renewal {
            renewals: Some(self.clone()),
            index,
            serial,
            started: false,
        };
        // After the push: a ticker that ends for want of claims looks once more after it
        // clears `ticking`, so either it sees this claim or this call sees it gone.
        renewal.started = self.ensure_ticker()?;
        Ok(renewal)
    }

    fn forget(&self, index: usize, serial: u64) {
        let mut held = self.lock();
        if held
            .slots
            .get(index)
            .and_then(Option::as_ref)
            .is_some_and(|s| s.serial == serial)
        {
            held.slots[index] = None;
            held.free.push(index);
        }
    }

    /// Starts the ticker unless one is alive: `Ok(true)` if this call started it.
    fn ensure_ticker(self: &Arc<Self>) -> Result<bool, NoTimer> {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Ok(false);
        };
        if self.ticking.load(Ordering::Acquire) || self.ticking.swap(true, Ordering::AcqRel) {
            return Ok(false);
        }
        let tick = self.tick;
        // tokio panics making a timer on a runtime without one: find out here, where the
        // request can still be refused, not in the ticker.
        let Ok(first) = std::panic::catch_unwind(AssertUnwindSafe(|| tokio::time::sleep(tick)))
        else {
            self.ticking.store(false, Ordering::Release);
            return Err(NoTimer);
        };
        let epoch = *self.lock().epoch.get_or_insert_with(Instant::now);
        let ticker = Ticker {
            renewals: Arc::downgrade(self),
            tick,
            epoch,
        };
        drop(runtime.spawn(ticker.run(first)));
        Ok(true)
    }
}

/// A count of the ticker's ticks (see the module docs).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tick(u64);

/// The runtime has no timer (`enable_time`): no lease can be renewed on it.
#[derive(Debug)]
pub(crate) struct NoTimer;

/// One claim's place in its service's renewals: renewed until stopped or dropped.
pub(crate) struct Renewal<St: IdempotencyStore> {
    renewals: Option<Arc<Renewals<St>>>,
    index: usize,
    serial: u64,
    started: bool,
}

impl<St: IdempotencyStore> Renewal<St> {
    /// No renewal (outside a runtime).
    pub(crate) fn none() -> Self {
        Renewal {
            renewals: None,
            index: 0,
            serial: 0,
            started: false,
        }
    }

    /// This claim started the ticker. The ticker is then only queued on this thread: on a
    /// multi-thread runtime tokio keeps a task spawned from a worker in a slot no other worker
    /// takes from, so a handler that never yields would keep the ticker from its first poll.
    /// The caller yields once before the handler runs.
    pub(crate) fn started_ticker(&self) -> bool {
        self.started
    }

    /// Stops renewing (the outcome is about to be stored: a renewal then would be refused).
    pub(crate) fn stop(&mut self) {
        if let Some(r) = self.renewals.take() {
            r.forget(self.index, self.serial);
        }
    }
}

impl<St: IdempotencyStore> Drop for Renewal<St> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Wakes every `tick` and renews the claims that fell due. Ends when its service is gone, or
/// when no claim was held for a whole lease (the next claim starts another).
struct Ticker<St> {
    renewals: Weak<Renewals<St>>,
    tick: Duration,
    epoch: Instant,
}

/// Clears `ticking` if the ticker is dropped before it ends (its runtime shut down), so that
/// the next claim starts another.
struct Ticking<St> {
    renewals: Weak<Renewals<St>>,
    /// This ticker owns the flag.
    armed: bool,
}

impl<St> Drop for Ticking<St> {
    fn drop(&mut self) {
        if let (true, Some(r)) = (self.armed, self.renewals.upgrade()) {
            r.ticking.store(false, Ordering::Release);
        }
    }
}

impl<St: IdempotencyStore> Ticker<St> {
    async fn run(self, first: Sleep) {
        let mut ticking = Ticking {
            renewals: self.renewals.clone(),
            armed: true,
        };
        first.await;
        let mut idle = 0;
        loop {
            let Some(renewals) = self.renewals.upgrade() else {
                return;
            };
            // Counted from the clock, not from wakes: a ticker that woke late (its thread was
            // busy) is at the right count, and renews all that fell due meanwhile.
            let now = Instant::now().saturating_duration_since(self.epoch);
            let tick = u64::try_from(now.as_nanos() / self.tick.as_nanos()).unwrap_or(u64::MAX);
            renewals.ticks.store(tick, Ordering::Release);
            let (due, any_held) = renewals.take_due(tick);
            idle = if any_held { 0 } else { idle + 1 };
            if idle > TICKS {
                // No claim for a whole lease: end, unless one came in meanwhile (see `hold`).
                renewals.ticking.store(false, Ordering::Release);
                if !renewals.any_held() || renewals.ticking.swap(true, Ordering::AcqRel) {
                    // Not ours to clear any more.
                    ticking.armed = false;
                    return;
                }
                idle = 0;
            }
            for (key, shown, claim) in due {
                renew(&renewals, key, shown, claim).await;
            }
            drop(renewals);
            tokio::time::sleep(self.tick).await;
        }
    }
}

impl<St: IdempotencyStore> Renewals<St> {
    /// The claims due for renewal at tick `now`, each queued again for a quarter lease from
    /// now (from when its renewal is sent, not from its reply: a slow reply delays no
    /// renewal). Also says whether any claim is held.
    #[allow(clippy::type_complexity)]
    fn take_due(&self, now: u64) -> (Vec<(Arc<str>, Arc<str>, Claim)>, bool) {
        let mut held = self.lock();
        let mut due = Vec::new();
        while let Some(&Reverse((at, index, serial))) = held.due.peek() {
            if at > now {
                break;
            }
            held.due.pop();
            let Some(slot) = held
                .slots
                .get(index)
                .and_then(Option::as_ref)
                .filter(|s| s.serial == serial)
            else {
                continue;
            };
            due.push((slot.key.clone(), slot.shown.clone(), slot.claim));
            held.due.push(Reverse((now + EVERY, index, serial)));
        }
        let any = held.slots.len() > held.free.len();
        (due, any)
    }

    fn any_held(&self) -> bool {
        let held = self.lock();
        held.slots.len() > held.free.len()
    }
}

/// Sends one renewal. It is polled here once, so that a store that answers at once (the memory
/// store) renews within this turn of the ticker; a store that must wait for a reply is awaited
/// from a task of its own, bounded by the renewal interval, so that the next renewal never
/// waits for it.
async fn renew<St: IdempotencyStore>(
    renewals: &Arc<Renewals<St>>,
    key: Arc<str>,
    shown: Arc<str>,
    claim: Claim,
) {
    let (store, lease) = (renewals.store.clone(), renewals.lease);
    let mut call = Box::pin(async move {
        let renewed = tokio::time::timeout(lease / 4, store.renew(&key, claim, lease)).await;
        match renewed {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                // Fenced: the lease ended (a store outage longer than it) and the key may have
                // been claimed again; the next tick tries again and is refused again, and the
                // claim's outcome is fenced when it is stored.
                tracing::warn!(error = %err, cause = super::cause(&err), fenced = err.is_fenced(), key = cap(&shown, 64), "idempotency claim not renewed");
            }
            Err(_) => {
                tracing::warn!(key = cap(&shown, 64), "idempotency claim renewal timed out");
            }
        }
    });
    let pending = std::future::poll_fn(|cx: &mut Context<'_>| {
        Poll::Ready(call.as_mut().poll(cx).is_pending())
    })
    .await;
    if pending {
        drop(tokio::spawn(
            call as Pin<Box<dyn Future<Output = ()> + Send>>,
        ));
    }
}

/// Holds the key in flight (renewing its lease) and, from a task of its own, tries to store
/// `record` again until it is stored, the claim is taken over (a store outage longer than the
/// lease), or the key's TTL has passed.
pub(crate) fn settle<St: IdempotencyStore>(c: Claimed<St>, record: StoredResponse) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(
            key = cap(&c.shown, 64),
            "idempotency outcome not stored outside a runtime: the key stays in flight until its lease ends"
        );
        return;
    };
    runtime.spawn(async move {
        let lease = c.config.lease;
        let give_up = Instant::now().checked_add(c.config.ttl);
        let mut wait = Duration::from_millis(100);
        loop {
            match c
                .store
                .complete(&c.key, c.claim, c.fingerprint, record.clone(), c.config.ttl)
                .await
            {
                Ok(()) => {
                    tracing::info!(key = cap(&c.shown, 64), "idempotency outcome stored after a retry");
                    return;
                }
                Err(err) if err.is_fenced() => {
                    tracing::warn!(key = cap(&c.shown, 64), "idempotency claim taken over before its outcome was stored (the store was out longer than the lease)");
                    return;
                }
                Err(err) => {
                    tracing::warn!(error = %err, cause = super::cause(&err), key = cap(&c.shown, 64), "idempotency outcome not stored yet; the key is held in flight");
                    if let Err(err) = c.store.renew(&c.key, c.claim, lease).await {
                        if err.is_fenced() {
                            return;
                        }
                    }
                }
            }
            if give_up.is_some_and(|end| Instant::now() >= end) {
                tracing::warn!(key = cap(&c.shown, 64), "idempotency outcome never stored within the key's TTL; the key is freed when its lease ends");
                return;
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(lease / 3);
        }
    });
}
