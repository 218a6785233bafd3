//! The budget's lock-free core. It has no clock: callers pass the epoch, the number of the
//! slot that the time falls in (see `super` for the design and how exact the window is;
//! `loom/` model-checks this file, compiled there unchanged).
//!
//! Three kinds of word, each a count with its epoch (`word.rs`):
//! - a deposit cell per stripe and slot, counting the deposits made in that slot;
//! - `head`: the current epoch and the retries granted in it. Every grant and every move to a
//!   new epoch is a compare-and-swap of this one word, so a grant commits only if nothing was
//!   granted and no slot expired since it was checked;
//! - a record per slot of the retries granted in a past epoch, written before `head` leaves
//!   that epoch.

use super::sync::{AtomicU32, AtomicU64, Ordering::*};
use super::word::{self, newer, pack};

/// Every `TICK`th deposit of a stripe in a slot asks its caller to read the clock.
pub(crate) const TICK: u32 = 16;

/// Keeps what it holds on cache lines of its own (128 bytes: adjacent-line prefetch pairs
/// 64-byte lines), so that writes to it do not slow readers of its neighbours.
#[repr(align(128))]
pub(crate) struct Padded<T>(pub(crate) T);

pub(crate) struct Ledger<const SLOTS: usize> {
    /// Deposit cells, a line of `SLOTS` per stripe. A thread writes its own stripe's only
    /// (threads past the number of stripes share them).
    stripes: Box<[Padded<[AtomicU64; SLOTS]>]>,
    /// The number of stripes, a power of two, less one.
    stripe_mask: usize,
    /// Retries always allowed in a window.
    floor: u64,
    /// Retries allowed per deposit, in millionths.
    per_million: u64,
    /// The epoch that deposits count in: read by every deposit, written about once a slot.
    hint: Padded<AtomicU32>,
    /// The current epoch and the retries granted in it.
    head: Padded<AtomicU64>,
    /// Retries granted in each of the last `SLOTS` epochs but the current one.
    closed: Padded<[AtomicU64; SLOTS]>,
}

/// The slot of an epoch. `SLOTS` divides 2^32, so slots follow epochs across the wrap.
const fn slot<const SLOTS: usize>(epoch: u32) -> usize {
    epoch as usize & (SLOTS - 1)
}

impl<const SLOTS: usize> Ledger<SLOTS> {
    /// A ledger starting at `epoch`, empty, with `stripes` (a power of two) deposit stripes,
    /// allowing `floor` retries per window plus `per_million` millionths of one per deposit.
    pub(crate) fn new(epoch: u32, stripes: usize, floor: u64, per_million: u64) -> Self {
        const { assert!(SLOTS.is_power_of_two() && SLOTS <= 1 << 16) };
        assert!(stripes.is_power_of_two());
        // Each slot starts as its latest epoch up to `epoch`, with nothing in it.
        let empty = |k: usize| {
            let age = epoch.wrapping_sub(k as u32) & (SLOTS as u32 - 1);
            AtomicU64::new(pack(epoch.wrapping_sub(age), 0))
        };
        Ledger {
            stripes: (0..stripes)
                .map(|_| Padded(std::array::from_fn(empty)))
                .collect(),
            stripe_mask: stripes - 1,
            floor,
            per_million,
            hint: Padded(AtomicU32::new(epoch)),
            head: Padded(AtomicU64::new(pack(epoch, 0))),
            closed: Padded(std::array::from_fn(empty)),
        }
    }

    /// Counts a deposit in the hinted epoch, on the stripe of thread `thread`. Returns the
    /// epoch it counts in, and whether the caller should read the clock and
    /// [`advance`](Self::advance).
    #[inline]
    pub(crate) fn deposit(&self, thread: usize) -> (u32, bool) {
        let epoch = self.hint.0.load(Relaxed);
        let cell = &self.stripes[thread & self.stripe_mask].0[slot::<SLOTS>(epoch)];
        // A count cannot reach 2^32 within a slot (at most 3.75 s; an atomic add takes more
        // than a nanosecond), so it never spills into the epoch.
        let old = cell.fetch_add(1, Relaxed);
        match word::epoch(old) {
            e if e == epoch => (epoch, (word::count(old) + 1).is_multiple_of(TICK)),
            // A newer epoch holds the cell (this thread read the hint just before it moved):
            // the deposit counts there, which is no later than the clock.
            e if newer(e, epoch) => (e, false),
            _ => (self.restart_slot(cell, epoch, old.wrapping_add(1)), false),
        }
    }

    /// The deposit went into the count of an expired epoch: start the slot over in `epoch`
    /// with it. `seen` is the cell as last seen, the deposit included.
    #[cold]
    fn restart_slot(&self, cell: &AtomicU64, epoch: u32, mut seen: u64) -> u32 {
        loop {
            let next = if newer(epoch, word::epoch(seen)) {
                // Still expired (and, if still the epoch we added to, our deposit is in the
                // count we drop): this deposit is the slot's first.
                pack(epoch, 1)
            } else {
                // Another deposit restarted the slot, dropping ours with the old count: add it
                // again.
                seen + 1
            };
            match cell.compare_exchange_weak(seen, next, Relaxed, Relaxed) {
                Ok(_) => return word::epoch(next),
                Err(actual) => seen = actual,
            }
        }
    }

    /// Moves deposits on to `epoch`, if it is newer than theirs.
    pub(crate) fn advance(&self, epoch: u32) {
        let mut hint = self.hint.0.load(Relaxed);
        while newer(epoch, hint) {
            match self
                .hint
                .0
                .compare_exchange_weak(hint, epoch, Relaxed, Relaxed)
            {
                Ok(_) => return,
                Err(actual) => hint = actual,
            }
        }
    }

    /// Grants a retry if the window ending at epoch `now` (or at a newer epoch another thread
    /// moved to) allows one; returns the epoch the grant counts in.
    pub(crate) fn withdraw(&self, now: u32) -> Option<u32> {
        self.advance(now);
        let mut head = self.head.0.load(Acquire);
        loop {
            let (epoch, granted) = (word::epoch(head), word::count(head));
            if newer(now, epoch) {
                // Record the epoch's grants before leaving it: a reader that sees the new
                // head sees the record (release here, acquire there).
                self.close(epoch, granted);
                head = match self
                    .head
                    .0
                    .compare_exchange(head, pack(now, 0), AcqRel, Acquire)
                {
                    Ok(_) => pack(now, 0),
                    Err(actual) => actual,
                };
                continue;
            }
            let in_window = self.granted_before(epoch) + u64::from(granted);
            if granted == u32::MAX || in_window >= self.allowed(self.deposits(epoch)) {
                return None;
            }
            let next = pack(epoch, granted + 1);
            match self.head.0.compare_exchange(head, next, AcqRel, Acquire) {
                Ok(_) => return Some(epoch),
                // A grant or a new epoch came first: check again against it.
                Err(actual) => head = actual,
            }
        }
    }

    /// Raises the record of `epoch` to `granted`. Records only grow: a thread that read the
    /// head earlier and writes a smaller count, or an older epoch, changes nothing.
    fn close(&self, epoch: u32, granted: u32) {
        let record = &self.closed.0[slot::<SLOTS>(epoch)];
        let mut seen = record.load(Relaxed);
        loop {
            let (e, count) = (word::epoch(seen), word::count(seen));
            if newer(e, epoch) || (e == epoch && count >= granted) {
                return;
            }
            match record.compare_exchange_weak(seen, pack(epoch, granted), Relaxed, Relaxed) {
                Ok(_) => return,
                Err(actual) => seen = actual,
            }
        }
    }

    /// Retries granted in the window's epochs before `epoch`. An epoch that was never the
    /// head's has no record of its own, and no grants.
    fn granted_before(&self, epoch: u32) -> u64 {
        (1..SLOTS as u32)
            .map(|age| {
                let e = epoch.wrapping_sub(age);
                let record = self.closed.0[slot::<SLOTS>(e)].load(Relaxed);
                if word::epoch(record) == e {
                    u64::from(word::count(record))
                } else {
                    0
                }
            })
            .sum()
    }

    /// Deposits counted in the window ending at `epoch`.
    fn deposits(&self, epoch: u32) -> u64 {
        let mut sum = 0;
        for stripe in self.stripes.iter() {
            for cell in &stripe.0 {
                let cell = cell.load(Relaxed);
                if epoch.wrapping_sub(word::epoch(cell)) < SLOTS as u32 {
                    sum += u64::from(word::count(cell));
                }
            }
        }
        sum
    }

    /// Retries a window with `deposits` allows.
    fn allowed(&self, deposits: u64) -> u64 {
        let earned = u128::from(deposits) * u128::from(self.per_million) / 1_000_000;
        self.floor
            .saturating_add(u64::try_from(earned).unwrap_or(u64::MAX))
    }
}

/// What the ledger holds for one epoch, for tests.
#[cfg(test)]
impl<const SLOTS: usize> Ledger<SLOTS> {
    /// Retries granted in `epoch`, if the ledger still holds it.
    pub(crate) fn granted_in(&self, epoch: u32) -> u64 {
        let head = self.head.0.load(Acquire);
        if word::epoch(head) == epoch {
            return u64::from(word::count(head));
        }
        let record = self.closed.0[slot::<SLOTS>(epoch)].load(Acquire);
        if word::epoch(record) == epoch {
            u64::from(word::count(record))
        } else {
            0
        }
    }

    /// Deposits counted in `epoch`.
    pub(crate) fn deposited_in(&self, epoch: u32) -> u64 {
        self.stripes
            .iter()
            .map(|stripe| stripe.0[slot::<SLOTS>(epoch)].load(Relaxed))
            .filter(|cell| word::epoch(*cell) == epoch)
            .map(|cell| u64::from(word::count(cell)))
            .sum()
    }

    /// The epoch deposits count in.
    pub(crate) fn hint(&self) -> u32 {
        self.hint.0.load(Relaxed)
    }
}
