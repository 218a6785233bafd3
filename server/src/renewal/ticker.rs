//! The ticker: a task of the layer's own, one per runtime, that renews the claims on its
//! runtime that fell due (see the module's docs above).

use std::sync::Weak;
use std::time::Duration;

use tokio::runtime::Id as RuntimeId;
use tokio::time::{Instant, Sleep};

use super::send::renew;
use super::Renewals;
use crate::store::IdempotencyStore;

/// Wakes every `tick` and renews the claims on its runtime that fell due. Ends when its layer
/// is gone, or with its runtime.
pub(super) struct Ticker<St> {
    pub(super) renewals: Weak<Renewals<St>>,
    pub(super) runtime: RuntimeId,
    pub(super) tick: Duration,
}

impl<St> Drop for Ticker<St> {
    /// The ticker's runtime dropped it (it shut down, or it never ran it): its claims' handlers
    /// ended with it. Forget them, so that the layer on another runtime with the same id (ids
    /// are not reused while a runtime lives) starts afresh.
    fn drop(&mut self) {
        if let Some(r) = self.renewals.upgrade() {
            r.lock().retain(|h| h.runtime != self.runtime);
        }
    }
}

impl<St: IdempotencyStore> Ticker<St> {
    /// The ticker's task. Its `Drop` runs even if the task is never polled: the future owns
    /// the ticker from the moment it is made.
    pub(super) async fn run(self, first: Sleep) {
        first.await;
        loop {
            let Some(renewals) = self.renewals.upgrade() else {
                return;
            };
            // Timed by the clock, not by wakes: a ticker that woke late (its thread was busy)
            // renews all that fell due meanwhile.
            let due = renewals.take_due(self.runtime, Instant::now());
            for claim in due {
                renew(&renewals, claim).await;
            }
            drop(renewals);
            tokio::time::sleep(self.tick).await;
        }
    }
}
