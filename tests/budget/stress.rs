//! Eight threads hammer one `LockFreeBudget` (each deposits and withdraws in turn) on tokio's
//! paused clock, which the test moves on slot by slot while they run, in three phases a full
//! window apart.
//!
//! - At every grant, the grants so far are at most `floor + 20 % of the deposits begun so far`
//!   (nothing expires within a phase, so the bound only grows).
//! - When a phase ends, withdrawing until refused brings its grants to exactly that bound: no
//!   deposit lost, no grant lost, none left over from the phase before.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use tower::retry::budget::Budget;
use tower_retry_safety::budget::LockFreeBudget;

use retry_safety_testing::soak::soak;

const THREADS: usize = 8;
/// 1 retry a second for 10 s.
const FLOOR: u64 = 10;
const SLOT: Duration = Duration::from_millis(625);

/// The most grants `deposits` allow (20 %, rounded down, on top of the floor).
fn bound(deposits: u64) -> u64 {
    FLOOR + deposits / 5
}

#[tokio::test(start_paused = true)]
async fn eight_threads_never_overdraw_and_lose_nothing() {
    let budget = Arc::new(LockFreeBudget::new(Duration::from_secs(10), 1, 0.2).unwrap());
    // A second or two by default; `RETRY_SAFETY_SOAK=1` for ten times as many.
    let ops_per_thread: u64 = soak(20_000, 200_000);
    for phase in 0..3 {
        // A withdrawal reads the clock, so the phase's deposits count from its first slot.
        let granted = Arc::new(AtomicU64::new(u64::from(budget.withdraw())));
        assert_eq!(granted.load(SeqCst), 1, "phase {phase}: the floor is back");
        let begun = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..THREADS)
            .map(|_| {
                let (budget, granted, begun) = (budget.clone(), granted.clone(), begun.clone());
                let runtime = tokio::runtime::Handle::current();
                std::thread::spawn(move || {
                    // The paused clock is the runtime's: read it through its handle.
                    let _clock = runtime.enter();
                    for _ in 0..ops_per_thread {
                        begun.fetch_add(1, SeqCst);
                        budget.deposit();
                        if budget.withdraw() {
                            let g = granted.fetch_add(1, SeqCst) + 1;
                            let d = begun.load(SeqCst);
                            assert!(g <= bound(d), "{g} grants after {d} deposits");
                        }
                    }
                })
            })
            .collect();
        // Move the clock on while they run, staying within the window (15 slots).
        let stop_ticking = stop.clone();
        let ticker = async move {
            for _ in 0..14 {
                if stop_ticking.load(SeqCst) {
                    break;
                }
                tokio::time::advance(SLOT).await;
                tokio::task::yield_now().await;
                std::thread::sleep(Duration::from_millis(2));
            }
        };
        let join = tokio::task::spawn_blocking(move || {
            for t in threads {
                t.join().expect("no thread panicked");
            }
            stop.store(true, SeqCst);
        });
        ticker.await;
        join.await.unwrap();

        let mut total = granted.load(SeqCst);
        while budget.withdraw() {
            total += 1;
        }
        let deposits = begun.load(SeqCst);
        assert_eq!(deposits, THREADS as u64 * ops_per_thread);
        assert_eq!(total, bound(deposits), "phase {phase}");
        // A full window on: nothing of this phase counts any more.
        tokio::time::advance(Duration::from_secs(10)).await;
    }
}
