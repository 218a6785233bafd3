//! Retry budgets: how many resends a policy may make, as a share of its requests, so that
//! retries cannot multiply the load on a struggling server.
//!
//! [`RetryPolicyBuilder::budget`](crate::RetryPolicyBuilder::budget) takes any
//! [`Budget`]: by default a [`LockFreeBudget`] (20 % of the last 10 s of requests plus 10 a
//! second). tower's [`Budget`] trait and its [`TpsBudget`] are re-exported here, so a custom
//! budget needs no `tower` import.
//!
//! ```
//! use std::time::Duration;
//! use tower_retry_safety::budget::LockFreeBudget;
//! use tower_retry_safety::RetryPolicy;
//!
//! let policy = RetryPolicy::builder()
//!     .budget(LockFreeBudget::new(Duration::from_secs(10), 5, 0.1)?)
//!     .build()?;
//! # drop(policy);
//! # Ok::<(), tower_retry_safety::BuildError>(())
//! ```

// How `LockFreeBudget` works: a retry budget with Finagle's semantics and no lock.
//
// Time is cut into 16 slots per window (`ttl / 16` each), numbered from the budget's creation
// (the *epoch*, a serial number that wraps at 2^32). The window is the current slot and the
// 15 before it. `ledger.rs` holds the lock-free part (no clock: it is handed epochs); this
// file reads tokio's clock and validates the settings.
//
// - A **deposit** loads the epoch that deposits count in (a word written at most once a slot)
//   and adds one to the calling thread's cell for that slot: a word holding the slot's epoch
//   beside its count, on a 128-byte line of 16 cells per thread stripe. A cell left from an
//   expired slot is recognised by its epoch and started over by the first deposit that finds
//   it; nobody has to clear it. Every 16th deposit of a stripe in a slot reads the clock and
//   moves the deposits' epoch on.
// - A **withdrawal** reads the clock, moves the window on, and sums the deposits and grants in
//   it. The current epoch and the retries granted in it are one word: a grant is a
//   compare-and-swap of that word from the value it checked, so it commits only if no other
//   grant and no new slot came in between (tower's `TpsBudget` checks, then adds, and can
//   overdraw). Leaving a slot records its grants in a per-slot word first, then swaps the
//   word; records only grow, so a late writer changes nothing.
//
// Why it never overdraws: a grant's check counts every grant of its window exactly (the
// current slot's in the word it swaps, the earlier ones in records written before the word
// left them) and deposits at most once each, in their slot or an earlier one (the deposits'
// epoch never runs ahead of the clock). `loom/` checks this under every interleaving.

mod ledger;
mod stripe;
mod sync;
#[cfg(test)]
mod tests;
mod word;

use std::fmt;
use std::time::Duration;

use crate::build_error::BuildError;
use tokio::time::Instant;

use ledger::Ledger;
pub use tower::retry::budget::{Budget, TpsBudget};

/// Slots per window: a power of two, so that slots follow epochs across their wrap.
const SLOTS: usize = 16;
/// Deposit stripes: threads beyond this many share them.
const STRIPES: usize = 16;

/// A retry budget without a lock: Finagle's `RetryBudget` semantics, those of tower's
/// [`TpsBudget`], and a deposit is an atomic add on a cache line of the calling thread's own.
///
/// Each request deposits; each retry withdraws. A retry is allowed while the retries of the
/// last `ttl`, itself included, stay within `min_per_sec × ttl` plus `retry_percent` × the
/// requests of the last `ttl` (kept in millionths, rounded down). It reads tokio's clock
/// ([`tokio::time::Instant`](https://docs.rs/tokio/1/tokio/time/struct.Instant.html)), so paused-time tests drive it.
///
/// # Cost
///
/// A deposit: a load and an atomic add, on one of 16 cache lines (threads take them in the
/// order they first deposit; past 16 threads they share), and a clock read every 16th time.
/// A withdrawal: a clock read, 256 counter loads and a compare-and-swap.
///
/// # How exact
///
/// - The window moves in steps of `ttl / 16`. A retry counts for between `ttl − ttl/16` and
///   `ttl`. A deposit counts from the slot of the latest clock read (every withdrawal makes
///   one, and every 16th deposit of a thread's stripe in a slot), normally its own, and then
///   for as long; after a stretch without retries and with few requests per thread, that slot
///   may be an earlier one, and the deposit expires early. Nothing counts for longer than
///   `ttl`.
/// - Concurrent withdrawals never overdraw: the bound holds at every grant under any
///   interleaving (model-checked with loom); two withdrawals racing for the last retry get one
///   between them.
/// - Against [`TpsBudget`] on the same sequence: the same grants, except that tower counts a
///   deposit or retry for between `ttl` and `ttl + ttl/10` (and for as little as half the
///   window under calls spaced just over a tenth of it apart: it moves one slot too far per
///   call then), rounds `1 / retry_percent` down to a whole number (at 0.3 it allows a third)
///   and `ttl` down to whole seconds for the floor.
///
/// ```
/// use std::time::Duration;
/// use tower_retry_safety::budget::{Budget, LockFreeBudget};
///
/// let budget = LockFreeBudget::new(Duration::from_secs(10), 0, 0.5)?;
/// budget.deposit();
/// budget.deposit();
/// assert!(budget.withdraw()); // 50 % of 2 requests
/// assert!(!budget.withdraw());
/// # Ok::<(), tower_retry_safety::BuildError>(())
/// ```
pub struct LockFreeBudget {
    ledger: Ledger<SLOTS>,
    origin: Instant,
    slot_nanos: u64,
    ttl: Duration,
    min_per_sec: u32,
    retry_percent: f32,
}

impl LockFreeBudget {
    /// A budget allowing `min_per_sec` retries a second plus `retry_percent` retries per
    /// request (0.2 = 20 %, at most 1000), over the last `ttl` (1 to 60 s).
    ///
    /// A value out of range is an error naming it.
    pub fn new(ttl: Duration, min_per_sec: u32, retry_percent: f32) -> Result<Self, BuildError> {
        const SETTING: &str = "lock_free_budget";
        if ttl < Duration::from_secs(1) || ttl > Duration::from_secs(60) {
            return Err(BuildError::setting(
                SETTING,
                format!("ttl {ttl:?} is outside 1 s to 60 s"),
            ));
        }
        if !(0.0..=1000.0).contains(&retry_percent) {
            return Err(BuildError::setting(
                SETTING,
                format!("retry_percent {retry_percent} is outside 0 to 1000"),
            ));
        }
        Ok(Self::unchecked(ttl, min_per_sec, retry_percent))
    }

    fn unchecked(ttl: Duration, min_per_sec: u32, retry_percent: f32) -> Self {
        let floor = u128::from(min_per_sec) * ttl.as_millis() / 1000;
        let per_million = (f64::from(retry_percent) * 1e6).round() as u64;
        LockFreeBudget {
            ledger: Ledger::new(0, STRIPES, floor as u64, per_million),
            origin: Instant::now(),
            slot_nanos: (ttl.as_nanos() / SLOTS as u128) as u64,
            ttl,
            min_per_sec,
            retry_percent,
        }
    }

    /// The number of the slot we are in.
    fn epoch(&self) -> u32 {
        let elapsed = Instant::now().saturating_duration_since(self.origin);
        // Wraps after 2^32 slots, as epochs do.
        (elapsed.as_nanos() as u64 / self.slot_nanos) as u32
    }
}

impl Budget for LockFreeBudget {
    #[inline]
    fn deposit(&self) {
        let (_, read_clock) = self.ledger.deposit(stripe::index());
        if read_clock {
            self.ledger.advance(self.epoch());
        }
    }

    fn withdraw(&self) -> bool {
        self.ledger.withdraw(self.epoch()).is_some()
    }
}

/// The same defaults as tower's `TpsBudget` and Finagle's: a 10 s window, 10 retries a
/// second, 20 % of requests.
impl Default for LockFreeBudget {
    fn default() -> Self {
        Self::unchecked(Duration::from_secs(10), 10, 0.2)
    }
}

impl fmt::Debug for LockFreeBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockFreeBudget")
            .field("ttl", &self.ttl)
            .field("min_per_sec", &self.min_per_sec)
            .field("retry_percent", &self.retry_percent)
            .finish()
    }
}
