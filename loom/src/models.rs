//! The ledger under loom's model checker: every interleaving (within the preemption bound) of
//! deposits, grants and moves to a new slot, on a two-slot window so that slots expire and
//! are reused within a few operations, starting one epoch before the wrap.
//!
//! ```sh
//! cd loom && RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release
//! ```
//!
//! What each model checks, after its threads are joined:
//! - **no overdraw**: for every epoch `w` in which a retry was granted, the grants counted in
//!   the window ending at `w` are at most the floor plus the percentage of the deposits made
//!   in it (`check_windows`). A grant that commits against a window that has since moved on,
//!   or a check-then-add race, breaks it.
//! - **the books**: each epoch the ledger still holds records exactly the grants returned in it,
//!   and a slot's newest epoch counts exactly the deposits that returned it.
//! - **nothing leaks**: withdrawing until refused afterwards brings the grants up to the exact
//!   allowance.

use loom::sync::Arc;
use loom::thread;

use crate::ledger::Ledger;

type L = Ledger<2>;
const SLOTS: u32 = 2;
/// One epoch before the wrap.
const E0: u32 = u32::MAX;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}

fn at(age: u32) -> u32 {
    E0.wrapping_add(age)
}

/// No overdraw: see the module docs. `grants` and `deposits` are the epochs returned.
fn check_windows(grants: &[u32], deposits: &[u32], floor: u64, per_deposit: u64) {
    let in_window = |w: u32, e: &u32| w.wrapping_sub(*e) < SLOTS;
    for &w in grants {
        let granted = grants.iter().filter(|e| in_window(w, e)).count() as u64;
        let deposited = deposits.iter().filter(|e| in_window(w, e)).count() as u64;
        assert!(
            granted <= floor + per_deposit * deposited,
            "window ending at {w}: {granted} grants, {deposited} deposits; grants {grants:?}"
        );
    }
}

/// The books: the ledger's count for each of `epochs` equals the grants returned in it.
fn check_books(ledger: &L, grants: &[u32], epochs: &[u32]) {
    for &e in epochs {
        let returned = grants.iter().filter(|g| **g == e).count() as u64;
        assert_eq!(ledger.granted_in(e), returned, "epoch {e}: {grants:?}");
    }
}

fn drain(ledger: &L, now: u32, grants: &mut Vec<u32>) {
    while let Some(e) = ledger.withdraw(now) {
        grants.push(e);
    }
}

/// Two threads withdraw (one also deposits) within one slot: at most floor + deposits, and
/// exactly that once drained.
#[test]
fn grants_within_a_slot_never_overdraw() {
    model(|| {
        let ledger = Arc::new(L::new(E0, 2, 1, 1_000_000));
        let l = ledger.clone();
        let t1 = thread::spawn(move || {
            let d = l.deposit(0).0;
            (d, l.withdraw(E0))
        });
        let l = ledger.clone();
        let t2 = thread::spawn(move || [l.withdraw(E0), l.withdraw(E0)]);
        let (d, g1) = t1.join().unwrap();
        let [g2, g3] = t2.join().unwrap();
        let mut grants: Vec<u32> = [g1, g2, g3].into_iter().flatten().collect();
        check_windows(&grants, &[d], 1, 1);
        check_books(&ledger, &grants, &[E0]);
        drain(&ledger, E0, &mut grants);
        assert_eq!(grants.len(), 2, "{grants:?}");
    });
}

/// One deposit, one thread withdrawing in its slot and one moving the window a slot on (the
/// deposit still in it): one grant between them, never two — the grant checked in the old
/// slot must not be lost from the books when the slot closes.
#[test]
fn a_new_slot_does_not_lose_a_racing_grant() {
    model(|| {
        let ledger = Arc::new(L::new(E0, 1, 0, 1_000_000));
        assert_eq!(ledger.deposit(0).0, E0);
        let l = ledger.clone();
        let t1 = thread::spawn(move || l.withdraw(E0));
        let l = ledger.clone();
        let t2 = thread::spawn(move || l.withdraw(at(1)));
        let mut grants: Vec<u32> = [t1.join().unwrap(), t2.join().unwrap()]
            .into_iter()
            .flatten()
            .collect();
        check_windows(&grants, &[E0], 0, 1);
        check_books(&ledger, &grants, &[E0, at(1)]);
        drain(&ledger, at(1), &mut grants);
        assert_eq!(grants.len(), 1, "{grants:?}");
    });
}

/// The window moves two slots on while a thread withdraws against the old one: the deposit
/// has expired for the new window, so a grant is only ever made, and counted, in the old.
#[test]
fn a_grant_never_uses_an_expired_deposit() {
    model(|| {
        let ledger = Arc::new(L::new(E0, 1, 0, 1_000_000));
        ledger.deposit(0);
        let l = ledger.clone();
        let t1 = thread::spawn(move || l.withdraw(E0));
        let l = ledger.clone();
        let t2 = thread::spawn(move || l.withdraw(at(2)));
        let g1 = t1.join().unwrap();
        assert_eq!(t2.join().unwrap(), None);
        assert!(matches!(g1, None | Some(E0)), "{g1:?}");
        let grants: Vec<u32> = g1.into_iter().collect();
        check_windows(&grants, &[E0], 0, 1);
        check_books(&ledger, &grants, &[E0]);
    });
}

/// Two threads move the window on, to the same slot or to different ones, while a grant from
/// the floor is still in it: the floor (one per window) is never granted twice, whichever
/// thread moves it and whatever the other sees meanwhile.
#[test]
fn racing_moves_keep_the_records() {
    for (a, b) in [(1, 1), (1, 2)] {
        model(move || {
            let ledger = Arc::new(L::new(E0, 1, 1, 0));
            let mut grants = vec![ledger.withdraw(E0).unwrap()];
            let l = ledger.clone();
            let t1 = thread::spawn(move || l.withdraw(at(a)));
            let l = ledger.clone();
            let t2 = thread::spawn(move || l.withdraw(at(b)));
            grants.extend(
                [t1.join().unwrap(), t2.join().unwrap()]
                    .into_iter()
                    .flatten(),
            );
            check_windows(&grants, &[], 1, 0);
            check_books(&ledger, &grants, &[at(b - 1), at(b)]);
            drain(&ledger, at(b), &mut grants);
            assert_eq!(grants.len(), b as usize, "{grants:?}");
        });
    }
}

/// Deposits on one stripe while the hint moves two slots on, reusing the cell of an expired
/// slot: every deposit that returned the new epoch is counted there exactly once, and the
/// expired count never adds to it.
#[test]
fn deposits_restarting_a_slot_are_counted_once() {
    model(|| {
        let ledger = Arc::new(L::new(E0, 1, 0, 0));
        ledger.deposit(0);
        let l = ledger.clone();
        let t1 = thread::spawn(move || {
            l.advance(at(2));
            l.deposit(0).0
        });
        let l = ledger.clone();
        let t2 = thread::spawn(move || [l.deposit(0).0, l.deposit(0).0]);
        let d1 = t1.join().unwrap();
        let [d2, d3] = t2.join().unwrap();
        assert_eq!(d1, at(2));
        assert_eq!(ledger.hint(), at(2));
        let returned = |e: u32| [d1, d2, d3].iter().filter(|d| **d == e).count() as u64;
        assert_eq!(ledger.deposited_in(at(2)), returned(at(2)));
        // The old slot's count: the first deposit and those that returned it, unless dropped.
        assert!(ledger.deposited_in(E0) <= 1 + returned(E0));
    });
}

/// Everything at once on two stripes: deposits (one sharing a stripe), grants in a slot, and
/// a move to the next slot that the deposits follow. Afterwards the window holds every grant
/// and every deposit, so draining it brings the grants to exactly floor + deposits.
#[test]
fn deposits_grants_and_a_move_together() {
    model(|| {
        let ledger = Arc::new(L::new(E0, 2, 1, 1_000_000));
        let d0 = ledger.deposit(0).0;
        let l = ledger.clone();
        let t1 = thread::spawn(move || {
            let d = l.deposit(1).0;
            (d, [l.withdraw(E0), l.withdraw(E0)])
        });
        let l = ledger.clone();
        let t2 = thread::spawn(move || {
            let g = l.withdraw(at(1));
            (l.deposit(0).0, g)
        });
        let g0 = ledger.withdraw(E0);
        let (d1, [g1, g2]) = t1.join().unwrap();
        let (d2, g3) = t2.join().unwrap();
        let deposits = [d0, d1, d2];
        let mut grants: Vec<u32> = [g0, g1, g2, g3].into_iter().flatten().collect();
        check_windows(&grants, &deposits, 1, 1);
        check_books(&ledger, &grants, &[E0, at(1)]);
        drain(&ledger, at(1), &mut grants);
        assert_eq!(grants.len(), 4, "{grants:?} {deposits:?}");
    });
}
