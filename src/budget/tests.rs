//! The ledger's arithmetic and windows, one thread at a time (`loom.rs` covers interleavings,
//! `tests/budget/stress.rs` real threads).

use std::time::Duration;

use tower::retry::budget::Budget;

use super::ledger::{Ledger, TICK};
use super::LockFreeBudget;

/// Withdraws at `epoch` until refused; returns the grants.
fn drain<const S: usize>(ledger: &Ledger<S>, epoch: u32) -> u64 {
    let mut n = 0;
    while ledger.withdraw(epoch).is_some() {
        n += 1;
    }
    n
}

#[test]
fn floor_and_percentage_are_exact_within_a_slot() {
    for (floor, per_million, deposits, expected) in [
        (0, 200_000, 0, 0),
        (0, 200_000, 4, 0),
        (0, 200_000, 5, 1),
        (0, 200_000, 1000, 200),
        (100, 200_000, 1000, 300),
        (3, 0, 50, 3),
        (0, 333_333, 3, 0),
        (0, 333_334, 3, 1),
        (0, 2_500_000, 2, 5),
    ] {
        let ledger = Ledger::<16>::new(7, 4, floor, per_million);
        for i in 0..deposits {
            ledger.deposit(i as usize);
        }
        assert_eq!(
            drain(&ledger, 7),
            expected,
            "floor {floor}, {per_million} ppm, {deposits} deposits"
        );
    }
}

#[test]
fn deposits_and_grants_count_for_sixteen_slots() {
    for start in [0, u32::MAX - 5] {
        let ledger = Ledger::<16>::new(start, 2, 0, 1_000_000);
        ledger.deposit(0);
        ledger.deposit(1);
        assert_eq!(
            ledger.withdraw(start.wrapping_add(15)),
            Some(start.wrapping_add(15))
        );
        assert_eq!(ledger.granted_in(start.wrapping_add(15)), 1);
        // One deposit left in the window, one grant: the grant stays for 16 slots too.
        ledger.deposit(0);
        assert_eq!(
            ledger.withdraw(start.wrapping_add(16)),
            None,
            "start {start}"
        );
        assert_eq!(ledger.deposited_in(start.wrapping_add(15)), 1);
        assert_eq!(drain(&ledger, start.wrapping_add(30)), 0);
        // The grant of slot 15 has expired; the deposit counted in slot 15 too.
        assert_eq!(drain(&ledger, start.wrapping_add(31)), 0);
        ledger.deposit(1);
        assert_eq!(drain(&ledger, start.wrapping_add(31)), 1);
    }
}

#[test]
fn the_floor_comes_back_as_grants_expire() {
    let ledger = Ledger::<16>::new(0, 1, 2, 0);
    assert_eq!(drain(&ledger, 0), 2);
    assert_eq!(drain(&ledger, 15), 0);
    assert_eq!(drain(&ledger, 16), 2);
    // Skipping many slots (and the epoch's wrap) expires everything.
    assert_eq!(drain(&ledger, 16 + (1 << 31) - 1), 2);
}

#[test]
fn a_deposit_counts_in_the_slot_of_the_last_clock_read() {
    let ledger = Ledger::<16>::new(0, 1, 0, 1_000_000);
    // No clock read since slot 0: deposits made "in slot 20" count in slot 0 and have
    // expired by slot 20.
    ledger.deposit(0);
    assert_eq!(ledger.withdraw(20), None);
    assert_eq!(ledger.hint(), 20);
    // Now they count in slot 20, restarting the stripe's cell for slot 4 (whatever it held
    // has expired).
    assert_eq!(ledger.deposit(0).0, 20);
    assert_eq!(ledger.deposited_in(20), 1);
    assert_eq!(ledger.withdraw(20), Some(20));
}

#[test]
fn every_sixteenth_deposit_of_a_stripe_in_a_slot_asks_for_the_clock() {
    let ledger = Ledger::<16>::new(0, 2, 0, 0);
    let asks: Vec<bool> = (0..2 * TICK).map(|_| ledger.deposit(1).1).collect();
    let at: Vec<usize> = (0..asks.len()).filter(|&i| asks[i]).collect();
    assert_eq!(at, [TICK as usize - 1, 2 * TICK as usize - 1]);
    ledger.advance(3);
    assert_eq!(ledger.deposit(1), (3, false));
}

#[test]
fn an_advance_never_moves_deposits_back() {
    let ledger = Ledger::<16>::new(10, 1, 0, 0);
    ledger.advance(12);
    ledger.advance(11);
    assert_eq!(ledger.hint(), 12);
    assert_eq!(ledger.deposit(0).0, 12);
}

#[test]
fn bad_settings_name_the_input() {
    let cases = [
        (Duration::from_millis(999), 10, 0.2, "ttl 999ms"),
        (Duration::from_secs(61), 10, 0.2, "ttl 61s"),
        (Duration::from_secs(10), 10, -0.5, "retry_percent -0.5"),
        (Duration::from_secs(10), 10, 1000.5, "retry_percent 1000.5"),
        (Duration::from_secs(10), 10, f32::NAN, "retry_percent NaN"),
    ];
    for (ttl, min, pct, needle) in cases {
        let e = LockFreeBudget::new(ttl, min, pct).unwrap_err();
        assert_eq!(e.setting_name(), "lock_free_budget");
        assert!(e.to_string().contains(needle), "{e}");
    }
    assert!(LockFreeBudget::new(Duration::from_secs(60), u32::MAX, 1000.0).is_ok());
}

/// The budget on tokio's paused clock: 10 s window, slots of 625 ms.
#[tokio::test(start_paused = true)]
async fn the_window_follows_tokios_clock() {
    let budget = LockFreeBudget::new(Duration::from_secs(10), 0, 1.0).unwrap();
    budget.deposit();
    tokio::time::advance(Duration::from_millis(9_374)).await; // slot 14
    assert!(budget.withdraw(), "the deposit of slot 0 still counts");
    tokio::time::advance(Duration::from_millis(626)).await; // 10 s: slot 16
    assert!(!budget.withdraw(), "the deposit of slot 0 has expired");
    budget.deposit(); // in slot 16: the withdrawal read the clock
    assert!(!budget.withdraw(), "the grant of slot 14 still counts");
    tokio::time::advance(Duration::from_millis(8_750)).await; // 18.75 s: slot 30
    assert!(
        budget.withdraw(),
        "the grant of slot 14 has expired, the deposit of 16 not"
    );
    assert!(!budget.withdraw());
}

#[test]
fn defaults_match_tower_and_finagle() {
    let budget = LockFreeBudget::default();
    let text = format!("{budget:?}");
    assert!(text.contains("ttl: 10s"), "{text}");
    // 10 a second for 10 s, then no more without deposits.
    assert_eq!((0..101).filter(|_| budget.withdraw()).count(), 100);
}
