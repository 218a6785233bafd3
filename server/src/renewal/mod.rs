//! Keeping a claim alive: renewing its lease while the handler runs, on a schedule of its own.
//! A claim whose lease lapses while its handler runs frees the key for a second run, so this
//! may not be left to chance.
//!
//! Renewal does not depend on how the handler yields: a task of the layer's own (the
//! *ticker*), one per tokio runtime the layer serves on, wakes on its own timer every twelfth
//! of the lease and renews each claim made on its runtime that has gone a quarter of the lease
//! since it was asked of the store or last renewed. A claim reads the clock before it asks the
//! store, so a slow reply eats none of the margin; a ticker that wakes late renews all that
//! fell due meanwhile. A renewal that fails is sent again every 1/48 of the lease until the next
//! one is due, so that a claim outlives a store outage that ends before its lease does. Each runtime has its own ticker because a claim's handler runs on its
//! runtime: a ticker elsewhere could be stranded on a runtime nobody drives while the handler
//! goes on. When a runtime shuts down, its ticker and its claims' handlers end together, as in
//! a crash.
//!
//! A ticker is a task like any other: on a current-thread runtime it runs only when the thread
//! comes round to it, and the thread's timers are read only once every task ready to run has
//! had its turn. Several busy handlers on one thread can so keep it waiting for the sum of
//! their stretches. So claims are also renewed from handlers' own tasks: each time a handler
//! is polled, or a key claimed, and some claim on its runtime has gone a quarter lease
//! unrenewed, every such claim is renewed there and then, its own and its neighbours' alike (at
//! most once a tick from each handler). With three busy handlers on one thread, a claim is then
//! renewed at the end of whichever stretch follows its quarter lease, not only when the thread
//! comes back round to its own handler (CI once saw a claim lapse that way). Whoever renews
//! first, the others see it (the claim's slot keeps when it was last renewed), so a claim is
//! renewed once per quarter lease, not twice.
//!
//! Registering a claim is a push under a lock; a claim that ends before its first renewal
//! (most do) costs nothing more: no task, no timer of its own, no clock read on the handler's
//! first poll. The queue keeps an entry of 32 bytes per claim until it would have been due (a
//! quarter lease).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::runtime::Id as RuntimeId;
use tokio::time::Instant;

mod send;
mod ticker;

use crate::observe::Observe;
use crate::store::{FencingToken, IdempotencyStore};
use send::{renew, send_renewal};
use ticker::Ticker;

/// A claim to renew: its key, the key as logs show it, and the claim.
type DueClaim = (Arc<str>, Arc<str>, FencingToken);

/// The ticker wakes this many times per lease.
const TICKS: u32 = 12;
/// A claim is renewed a quarter lease after it was asked of the store or last renewed, and so
/// at most a third (a quarter and a tick) after.
const EVERY: u32 = 4;
/// A renewal that failed is sent again this many times per lease (a quarter of a tick), until
/// the next one is due.
const RETRY: u32 = 48;

/// The claims of one layer that are held while their handlers run, per runtime, and the
/// tickers that renew them.
pub(crate) struct Renewals<St> {
    store: Arc<St>,
    lease: Duration,
    /// The layer's instruments: each renewal's result.
    observe: Observe,
    /// A twelfth of the lease.
    tick: Duration,
    runtimes: Mutex<Vec<Held>>,
}

/// The claims held on one runtime: a slot each, and when each falls due.
struct Held {
    runtime: RuntimeId,
    /// A ticker was spawned for this runtime and has not ended.
    ticking: bool,
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    /// `(due, slot, serial)`, soonest first. An ended claim's entry stays until it is due, and
    /// is skipped then (its slot was freed or reused: the serial tells).
    due: BinaryHeap<Reverse<(Instant, usize, u64)>>,
    serial: u64,
}

struct Slot {
    key: Arc<str>,
    shown: Arc<str>,
    token: FencingToken,
    serial: u64,
    /// When the claim was asked of the store, or its last renewal sent (by the ticker or from
    /// the handler's task).
    renewed: Instant,
}

impl<St> std::fmt::Debug for Renewals<St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renewals")
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl<St> Renewals<St> {
    pub(crate) fn new(store: Arc<St>, lease: Duration, observe: Observe) -> Self {
        Renewals {
            store,
            lease,
            observe,
            tick: (lease / TICKS).max(Duration::from_millis(1)),
            runtimes: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Held>> {
        // Each change under the lock is one push or one take: a poisoned lock is still usable.
        self.runtimes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Held {
    /// Puts `slot` in a free place (or a new one): its index.
    fn place(&mut self, slot: Slot) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        }
    }
}

fn held_for(runtimes: &mut Vec<Held>, runtime: RuntimeId) -> &mut Held {
    let i = match runtimes.iter().position(|h| h.runtime == runtime) {
        Some(i) => i,
        None => {
            runtimes.push(Held {
                runtime,
                ticking: false,
                slots: Vec::new(),
                free: Vec::new(),
                due: BinaryHeap::new(),
                serial: 0,
            });
            runtimes.len() - 1
        }
    };
    &mut runtimes[i]
}

impl<St: IdempotencyStore> Renewals<St> {
    pub(crate) fn store(&self) -> &Arc<St> {
        &self.store
    }

    /// The time to pass to [`hold`](Self::hold): read before the store is asked, so that
    /// renewals are timed from no later than the store's lease began.
    pub(crate) fn now(&self) -> Instant {
        Instant::now()
    }

    /// Holds the claim with `token` on `key` (`shown` in logs; asked of the store at `sent`) until the
    /// returned guard is stopped or dropped, renewing its lease meanwhile from a ticker on the
    /// current runtime. A claim whose store answered so late that its first renewal is already
    /// due is renewed at once, not at the ticker's next wake. `Err` on a runtime without a
    /// timer, where no ticker can run (the claim may still be released: nothing ran). Outside
    /// a runtime nothing is renewed.
    pub(crate) fn hold(
        self: &Arc<Self>,
        key: &Arc<str>,
        shown: &Arc<str>,
        token: FencingToken,
        sent: Instant,
    ) -> Result<Renewal<St>, NoTimer> {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return Ok(Renewal::none());
        };
        let runtime = handle.id();
        let mut runtimes = self.lock();
        let held = held_for(&mut runtimes, runtime);
        let start_ticker = !held.ticking;
        let first = if start_ticker {
            // tokio panics making a timer on a runtime without one: find out here, where the
            // request can still be refused, not in the ticker.
            let tick = self.tick;
            let first = std::panic::catch_unwind(AssertUnwindSafe(|| tokio::time::sleep(tick)))
                .map_err(|_| NoTimer)?;
            held.ticking = true;
            if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread {
                // Once per layer and runtime: the bound the server docs state.
                tracing::warn!("IdempotencyLayer serves keyed requests on a current-thread runtime: a claim is kept only while the thread reads its timers or comes back to one of the layer's handlers at least once per half lease (see the server docs, \"Renewal guarantee\"); a multi-thread runtime keeps claims whatever the handlers do");
            }
            Some(first)
        } else {
            None
        };
        let serial = held.serial;
        held.serial += 1;
        let slot = Slot {
            key: key.clone(),
            shown: shown.clone(),
            token,
            serial,
            renewed: sent,
        };
        let index = held.place(slot);
        let mut due = sent + self.lease / EVERY;
        let now = Instant::now();
        let late = now >= due;
        if late {
            due = now + self.lease / EVERY;
            if let Some(slot) = held.slots[index].as_mut() {
                slot.renewed = now;
            }
        }
        held.due.push(Reverse((due, index, serial)));
        // A claim is a moment the thread is on one of the layer's tasks: the claims on this
        // runtime that are due are renewed now, and the handler's task looks again when the
        // first of them falls due (not before a tick from now), not only when its own does.
        let neighbours = self.take_due_in(held, now);
        let next = self.next_look(held, now, due);
        drop(runtimes);
        self.send_from_task(neighbours);
        if late {
            let (renewals, key, shown) = (self.clone(), key.clone(), shown.clone());
            drop(handle.spawn(async move { renew(&renewals, (key, shown, token)).await }));
        }
        if let Some(first) = first {
            // The guard goes into the task before it is spawned: a task that the runtime drops
            // unpolled (it was shutting down) still clears `ticking` for its runtime.
            let ticker = Ticker {
                renewals: Arc::downgrade(self),
                runtime,
                tick: self.tick,
            };
            drop(handle.spawn(ticker.run(first)));
        }
        Ok(Renewal {
            renewals: Some((self.clone(), runtime)),
            index,
            serial,
            spawned: start_ticker || late,
            next,
        })
    }

    fn forget(&self, runtime: RuntimeId, index: usize, serial: u64) {
        let mut runtimes = self.lock();
        let Some(held) = runtimes.iter_mut().find(|h| h.runtime == runtime) else {
            return;
        };
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

    /// The claims on `runtime` due for renewal at `now`, each queued again for a quarter lease
    /// from now (from when its renewal is sent, not from its reply: a slow reply delays no
    /// renewal).
    fn take_due(&self, runtime: RuntimeId, now: Instant) -> Vec<DueClaim> {
        let mut runtimes = self.lock();
        match runtimes.iter_mut().find(|h| h.runtime == runtime) {
            Some(held) => self.take_due_in(held, now),
            None => Vec::new(),
        }
    }

    /// [`take_due`](Self::take_due) on the claims of one runtime, under the lock.
    fn take_due_in(&self, held: &mut Held, now: Instant) -> Vec<DueClaim> {
        let mut due = Vec::new();
        while let Some(&Reverse((at, index, serial))) = held.due.peek() {
            if at > now {
                break;
            }
            held.due.pop();
            let Some(slot) = held
                .slots
                .get_mut(index)
                .and_then(Option::as_mut)
                .filter(|s| s.serial == serial)
            else {
                continue;
            };
            let next = match self.renew_if_due(slot, now) {
                Ok(renew) => {
                    due.push(renew);
                    now + self.lease / EVERY
                }
                // Renewed from its handler's task since it was queued.
                Err(next) => next,
            };
            held.due.push(Reverse((next, index, serial)));
        }
        due
    }

    /// `slot`'s claim to renew if it has gone a quarter lease unrenewed at `now` (marked as
    /// renewed now), or when it will have.
    fn renew_if_due(
        &self,
        slot: &mut Slot,
        now: Instant,
    ) -> Result<(Arc<str>, Arc<str>, FencingToken), Instant> {
        let next = slot.renewed + self.lease / EVERY;
        if next > now {
            return Err(next);
        }
        slot.renewed = now;
        Ok((slot.key.clone(), slot.shown.clone(), slot.token))
    }

    /// Sends the renewals of `due` from a handler's task (not the ticker's): each is polled
    /// once here, and one that must wait for its reply goes on in a task of its own.
    fn send_from_task(&self, due: Vec<DueClaim>) {
        for (key, shown, token) in due {
            send_renewal(
                &self.store,
                self.lease,
                &self.observe,
                key,
                shown,
                token,
                &mut Context::from_waker(Waker::noop()),
            );
        }
    }

    /// For a handler's task at `now`: every claim on `runtime` that is due (the ticker's work,
    /// done early), and when this handler's task should look again ([`next_look`]).
    /// `None` when the runtime's ticker has ended (it is shutting down).
    ///
    /// [`next_look`]: Self::next_look
    fn take_due_from_handler(
        &self,
        runtime: RuntimeId,
        own: (usize, u64),
        now: Instant,
    ) -> Option<(Vec<DueClaim>, Instant)> {
        let mut runtimes = self.lock();
        let held = runtimes.iter_mut().find(|h| h.runtime == runtime)?;
        let due = self.take_due_in(held, now);
        let (index, serial) = own;
        let own_due = held
            .slots
            .get(index)
            .and_then(Option::as_ref)
            .filter(|s| s.serial == serial)?
            .renewed
            + self.lease / EVERY;
        Some((due, self.next_look(held, now, own_due)))
    }

    /// When a handler whose own claim falls due at `own_due` looks at the runtime's claims
    /// again: when the first of them falls due, not before a tick from `now`, never after its
    /// own. The queue's first entry may be early (a claim renewed since, or ended): early is
    /// safe.
    fn next_look(&self, held: &Held, now: Instant, own_due: Instant) -> Instant {
        let first = held.due.peek().map_or(own_due, |Reverse((at, _, _))| *at);
        first.max(now + self.tick).min(own_due)
    }
}

/// The runtime has no timer (`enable_time`): no lease can be renewed on it.
#[derive(Debug)]
pub(crate) struct NoTimer;

/// One claim's place in its layer's renewals: renewed until stopped or dropped.
pub(crate) struct Renewal<St: IdempotencyStore> {
    /// The layer's renewals and the runtime the claim was made on; `None` outside a runtime.
    renewals: Option<(Arc<Renewals<St>>, RuntimeId)>,
    index: usize,
    serial: u64,
    spawned: bool,
    /// Not before this is the claim due for renewal (a renewal by the ticker may have put it
    /// later: the slot knows).
    next: Instant,
}

impl<St: IdempotencyStore> Renewal<St> {
    /// No renewal (outside a runtime).
    pub(crate) fn none() -> Self {
        Renewal {
            renewals: None,
            index: 0,
            serial: 0,
            spawned: false,
            next: Instant::now(),
        }
    }

    /// This claim spawned a task (its runtime's ticker, or its own first renewal). The task is
    /// then only queued on this thread: on a multi-thread runtime tokio keeps a task spawned
    /// from a worker in a slot no other worker takes from, so a handler that never yields
    /// would keep it from its first poll. The caller yields once before the handler runs.
    pub(crate) fn spawned_task(&self) -> bool {
        self.spawned
    }

    /// Runs `work` (the handler and its response body), renewing from this task too, on each
    /// poll, every claim on the runtime that has gone a quarter lease unrenewed, this one's
    /// included (see the module's docs for why the ticker alone is not enough). The first poll
    /// reads no clock when it follows the claim at once; a task that yielded since (it spawned
    /// a task) may come back to it late.
    pub(crate) fn during<F: Future>(&mut self, work: F) -> During<'_, St, F> {
        During {
            check: self.spawned,
            renewal: self,
            work,
        }
    }

    fn renew_if_due(&mut self) {
        let Some((renewals, runtime)) = &self.renewals else {
            return;
        };
        let now = Instant::now();
        if now < self.next {
            return;
        }
        match renewals.take_due_from_handler(*runtime, (self.index, self.serial), now) {
            Some((due, next)) => {
                self.next = next;
                renewals.send_from_task(due);
            }
            // Its runtime's ticker ended (the runtime is shutting down).
            None => self.next = now + renewals.lease,
        }
    }

    /// Stops renewing (the outcome is about to be stored: a renewal then would be refused).
    pub(crate) fn stop(&mut self) {
        if let Some((r, runtime)) = self.renewals.take() {
            r.forget(runtime, self.index, self.serial);
        }
    }
}

impl<St: IdempotencyStore> Drop for Renewal<St> {
    fn drop(&mut self) {
        self.stop();
    }
}

pin_project! {
    /// [`Renewal::during`]: a plain future rather than an `async fn`, so that the handler's
    /// future is moved into it once, not twice.
    pub(crate) struct During<'r, St: IdempotencyStore, F> {
        renewal: &'r mut Renewal<St>,
        // Whether this poll checks the clock.
        check: bool,
        #[pin]
        work: F,
    }
}

impl<St: IdempotencyStore, F: Future> Future for During<'_, St, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        if std::mem::replace(this.check, true) {
            this.renewal.renew_if_due();
        }
        this.work.poll(cx)
    }
}
