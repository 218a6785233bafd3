//! How much a request may be retried: the count, the budget, the replay buffer.

use super::*;

impl RetryPolicyBuilder {
    /// How many times a request may be retried after its first attempt.
    ///
    /// Defaults to 2 (3 attempts in all). At most 100.
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.timing.max_retries = retries;
        self
    }

    /// The most bytes of a streaming request body kept so that a retry can replay it (see
    /// [`Replayable`](crate::service::Replayable)); `0` turns recording off, and a stream is then sent
    /// once. A body is recorded only when the request may be retried, and its chunks are kept
    /// as handles, not copies. A body that is larger (by its size hint before it is sent, or
    /// as it streams) is sent once, and its report says why
    /// ([`NotReplayable::OverLimit`](crate::attempts::NotReplayable::OverLimit)). Bodies that can be
    /// copied (`Full`, `Bytes`, `String`…) are not limited by it.
    ///
    /// Defaults to 64 KiB. At most 1 GiB.
    pub fn replay_buffer(mut self, limit_bytes: usize) -> Self {
        self.timing.replay_buffer = limit_bytes;
        self
    }

    /// Limit retries with this crate's [`LockFreeBudget`]: each request deposits, each retry
    /// withdraws, and a retry is allowed while the retries of the last `ttl` stay within
    /// `min_per_sec × ttl` plus `retry_percent` of the requests of the last `ttl` (Finagle's
    /// semantics, as [`tps_budget`](Self::tps_budget)). No lock: a deposit is one atomic add on
    /// a cache line of the calling thread's own. `ttl` is 1–60 s, `retry_percent` 0–1000
    /// (0.2 = 20 % extra load); `build` checks them.
    ///
    /// Defaults to a 10 s window, 10 retries per second floor, 20 % extra load.
    pub fn lock_free_budget(mut self, ttl: Duration, min_per_sec: u32, retry_percent: f32) -> Self {
        self.timing.budget = BudgetChoice::LockFree {
            ttl,
            min_per_sec,
            retry_percent,
        };
        self
    }

    /// Limit retries with tower's [`TpsBudget`](crate::budget::TpsBudget) instead, with the same meaning as
    /// [`lock_free_budget`](Self::lock_free_budget). It takes a mutex and reads the clock on
    /// every deposit and withdrawal, and two threads withdrawing at once can overdraw it.
    /// `ttl` is 1–60 s, `retry_percent` 0–1000, `min_per_sec` below `i32::MAX`; `build` checks
    /// them.
    ///
    /// Defaults to the [`lock_free_budget`](Self::lock_free_budget) above.
    pub fn tps_budget(mut self, ttl: Duration, min_per_sec: u32, retry_percent: f32) -> Self {
        self.timing.budget = BudgetChoice::Tps {
            ttl,
            min_per_sec,
            retry_percent,
        };
        self
    }

    /// Limit retries with any tower [`Budget`](crate::budget::Budget) (re-exported by this crate).
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use tower_retry_safety::budget::Budget;
    /// use tower_retry_safety::RetryPolicy;
    ///
    /// /// At most ten retries for the life of the process.
    /// struct TenRetries(AtomicU32);
    ///
    /// impl Budget for TenRetries {
    ///     fn deposit(&self) {}
    ///     fn withdraw(&self) -> bool {
    ///         self.0
    ///             .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
    ///             .is_ok()
    ///     }
    /// }
    ///
    /// let policy = RetryPolicy::builder().budget(TenRetries(AtomicU32::new(10))).build()?;
    /// # drop(policy);
    /// # Ok::<(), tower_retry_safety::BuildError>(())
    /// ```
    ///
    /// Defaults to the [`lock_free_budget`](Self::lock_free_budget) above.
    pub fn budget(mut self, budget: impl Budget + Send + Sync + 'static) -> Self {
        self.timing.budget = BudgetChoice::Custom(Arc::new(budget));
        self
    }

    /// No budget: only [`max_retries`](Self::max_retries) limits retries.
    ///
    /// Defaults to the [`lock_free_budget`](Self::lock_free_budget) above.
    pub fn no_budget(mut self) -> Self {
        self.timing.budget = BudgetChoice::Unlimited;
        self
    }
}
