//! The hedge budget: each hedge-able request deposits `max_extra_load` of a token, each hedge
//! withdraws a whole one, so hedges never exceed that share of the requests. Lock-free: one
//! atomic word in millionths of a token.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// One token, in millionths.
const TOKEN: u64 = 1_000_000;
/// The most tokens saved up: a quiet spell does not buy a burst of hedges later.
const CAP: u64 = 10 * TOKEN;

pub(crate) struct HedgeTokens {
    balance: AtomicU64,
    per_request: u64,
}

impl HedgeTokens {
    /// `extra_load` in (0, 1], checked by the builder.
    pub(crate) fn new(extra_load: f64) -> Self {
        HedgeTokens {
            balance: AtomicU64::new(0),
            per_request: ((extra_load * TOKEN as f64).round() as u64).clamp(1, TOKEN),
        }
    }

    pub(crate) fn deposit(&self) {
        let _ = self.balance.fetch_update(Relaxed, Relaxed, |b| {
            Some((b + self.per_request).min(CAP.max(b)))
        });
    }

    /// Takes a token if there is one.
    pub(crate) fn withdraw(&self) -> bool {
        self.balance
            .fetch_update(Relaxed, Relaxed, |b| b.checked_sub(TOKEN))
            .is_ok()
    }

    /// Gives back a token taken for a hedge that was not sent after all.
    pub(crate) fn refund(&self) {
        self.balance.fetch_add(TOKEN, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hedges_never_exceed_the_share_of_requests() {
        let t = HedgeTokens::new(0.05);
        let mut hedges = 0;
        for _ in 0..1000 {
            t.deposit();
            if t.withdraw() {
                hedges += 1;
            }
        }
        assert_eq!(hedges, 50);
        assert!(!t.withdraw());
    }

    #[test]
    fn savings_are_capped() {
        let t = HedgeTokens::new(1.0);
        for _ in 0..100 {
            t.deposit();
        }
        let granted = (0..100).filter(|_| t.withdraw()).count();
        assert_eq!(granted, 10);
        t.refund();
        assert!(t.withdraw());
    }

    #[test]
    fn concurrent_withdrawals_never_overdraw() {
        let t = std::sync::Arc::new(HedgeTokens::new(0.5));
        for _ in 0..10 {
            t.deposit();
        }
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let t = t.clone();
                std::thread::spawn(move || (0..10).filter(|_| t.withdraw()).count())
            })
            .collect();
        let granted: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(granted, 5);
    }
}
