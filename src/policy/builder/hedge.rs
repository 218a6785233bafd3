//! Hedging: a backup attempt for a slow request a repeat cannot harm.

use super::*;

impl RetryPolicyBuilder {
    /// Send a backup attempt when an attempt is slow (see [`Hedge`](crate::hedge::Hedge) for what
    /// is hedged, when, and what it costs). A write that may have been applied is never
    /// hedged.
    ///
    /// ```
    /// use tower_retry_safety::{Hedge, RetryPolicy};
    ///
    /// let policy = RetryPolicy::builder().hedge(Hedge::learned().max_extra_load(0.01)).build()?;
    /// # drop(policy);
    /// # Ok::<(), tower_retry_safety::BuildError>(())
    /// ```
    ///
    /// Defaults to no hedging. `build` checks the setting.
    pub fn hedge(mut self, hedge: crate::hedge::Hedge) -> Self {
        self.hedge = Some(hedge);
        self
    }
}
