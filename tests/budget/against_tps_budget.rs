//! `LockFreeBudget` against tower's `TpsBudget`, same settings, same sequence, one thread, on
//! tokio's paused clock. They grant exactly alike when:
//!
//! - `1 / retry_percent` (or `1000 / retry_percent` above 1) is a whole number and `ttl` is
//!   whole seconds (tower rounds both down: at 0.3 it allows a third, we 30 %);
//! - at each withdrawal, every earlier deposit and grant is younger than `ttl − ttl/16` or
//!   older than `ttl + ttl/10` (between the two, tower may still count what we have expired:
//!   we count each for between `ttl − ttl/16` and `ttl`, tower for between `ttl` and
//!   `ttl + ttl/10`; `expiry_ages` measures both);
//! - time moves between tower's calls by whole tenths of `ttl` (tower's slot): for a step
//!   between two multiples, tower moves its window one slot too far, and under steady calls
//!   slightly over a slot apart it keeps about half a window (`uneven_steps` shows it);
//! - a withdrawal came first after a quiet stretch (a deposit counts in the slot of the latest
//!   clock read, which a withdrawal makes; tower reads the clock on every deposit).

use std::time::Duration;

use proptest::prelude::*;
use retry_safety_testing::logs::block_on as paused;
use tower::retry::budget::{Budget, TpsBudget};
use tower_retry_safety::budget::LockFreeBudget;

fn both(ttl_secs: u64, min_per_sec: u32, percent: f32) -> (LockFreeBudget, TpsBudget) {
    let ttl = Duration::from_secs(ttl_secs);
    (
        LockFreeBudget::new(ttl, min_per_sec, percent).unwrap(),
        TpsBudget::new(ttl, min_per_sec, percent),
    )
}

/// Withdraws until refused; returns the grants.
fn drain(budget: &impl Budget) -> u32 {
    let mut n = 0;
    while budget.withdraw() {
        n += 1;
    }
    n
}

#[test]
fn the_floor_and_the_percentage_grant_alike() {
    paused(async {
        for ttl in [1, 10, 60] {
            for min in [0, 1, 10] {
                for percent in [0.0, 0.1, 0.2, 0.25, 0.5, 1.0, 2.0, 1000.0] {
                    for deposits in [0, 1, 4, 5, 99, 1000] {
                        if percent * deposits as f32 > 2000.0 {
                            continue; // as many grants to drain adds nothing
                        }
                        let (ours, tower) = both(ttl, min, percent);
                        for _ in 0..deposits {
                            ours.deposit();
                            tower.deposit();
                        }
                        let (a, b) = (drain(&ours), drain(&tower));
                        assert_eq!(a, b, "ttl {ttl}, min {min}, {percent}, {deposits} deposits");
                        // A whole window later (and tower's extra tenth), the floor is back.
                        tokio::time::advance(Duration::from_secs(ttl) * 12 / 10).await;
                        assert_eq!(drain(&ours), drain(&tower));
                        assert_eq!(drain(&ours), 0);
                    }
                }
            }
        }
    });
}

/// Where the two differ, measured: how old a deposit is when it stops counting.
#[test]
fn expiry_ages() {
    let ttl = Duration::from_secs(1);
    let age_at_expiry = |make: &dyn Fn() -> Box<dyn Budget>| {
        paused(async {
            for ms in (0..=1500).step_by(5) {
                let budget = make();
                budget.deposit();
                tokio::time::advance(Duration::from_millis(ms)).await;
                if !budget.withdraw() {
                    return ms;
                }
            }
            unreachable!("a deposit counted for 1.5 s");
        })
    };
    let ours = age_at_expiry(&|| Box::new(LockFreeBudget::new(ttl, 0, 1.0).unwrap()));
    let tower = age_at_expiry(&|| Box::new(TpsBudget::new(ttl, 0, 1.0)));
    println!(
        "a deposit made at a slot's start stops counting at {ours} ms here, {tower} ms in tower"
    );
    // Made at the start of its slot, ours counts for the whole window.
    assert_eq!(ours, 1000);
    assert!(tower > 1000 && tower <= 1100, "{tower}");
}

/// Calls slightly over one of tower's slots apart: we count a deposit for the whole window;
/// tower, moving two slots per call, drops it after about half of it.
#[test]
fn uneven_steps() {
    let ttl = Duration::from_secs(1);
    let step = Duration::from_millis(101);
    let counted_for = |budget: &dyn Budget| {
        paused(async {
            // 1000 retries per deposit: a withdrawal a step does not spend it.
            budget.deposit();
            let mut age = Duration::ZERO;
            while budget.withdraw() {
                tokio::time::advance(step).await;
                age += step;
            }
            age
        })
    };
    let ours = counted_for(&LockFreeBudget::new(ttl, 0, 1000.0).unwrap());
    let tower = counted_for(&TpsBudget::new(ttl, 0, 1000.0));
    println!(
        "calls 101 ms apart, 1 s window: a deposit counted for {ours:?} here, {tower:?} in tower"
    );
    assert!(ours >= ttl * 15 / 16 && ours <= ttl + step, "{ours:?}");
}

#[derive(Clone, Debug)]
enum Op {
    Deposit,
    Withdraw,
    /// Time moves on by one of tower's slots (a tenth of the window).
    Step,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Deposit),
        2 => Just(Op::Withdraw),
        1 => Just(Op::Step),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Segments of operations a whole window (and tower's extra tenth) apart, each opening
    /// with a withdrawal and spanning at most 9 tenths of the window: every withdrawal is
    /// granted or refused alike.
    #[test]
    fn any_sequence_within_the_documented_accuracy_grants_alike(
        ttl in 1u64..=60,
        min in 0u32..4,
        percent in prop::sample::select(vec![0.0f32, 0.1, 0.2, 0.5, 1.0, 3.0]),
        segments in prop::collection::vec(prop::collection::vec(op(), 0..40), 1..5),
    ) {
        paused(async {
            let (ours, tower) = both(ttl, min, percent);
            let ttl = Duration::from_secs(ttl);
            for segment in segments {
                prop_assert_eq!(ours.withdraw(), tower.withdraw());
                let mut steps = 0;
                for op in segment {
                    match op {
                        Op::Deposit => {
                            ours.deposit();
                            tower.deposit();
                        }
                        Op::Withdraw => prop_assert_eq!(ours.withdraw(), tower.withdraw()),
                        Op::Step if steps < 9 => {
                            steps += 1;
                            tokio::time::advance(ttl / 10).await;
                        }
                        Op::Step => {}
                    }
                }
                tokio::time::advance(ttl * 12 / 10).await;
            }
            Ok(())
        })?;
    }
}
