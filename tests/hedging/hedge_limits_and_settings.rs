//! Hedging's limits and settings, on paused tokio time (the adversarial review of safe hedging
//! and the per-attempt spans, issue 25): the loser is dropped and each attempt carries its
//! number, an inner layer does not hedge again, timeouts, the deadline and `max_extra_load`
//! bound the sends, nonsense settings are refused and a huge delay never hedges. A defect the
//! review found is fixed and its test runs: a GET with a trusted key was not hedged (on the
//! safe side: a keyed read now keeps its method's verdict).

use std::sync::atomic::Ordering;
use std::time::Duration;

use http::Request;
use retry_safety_testing::hedging_stacks::{fast, get, report, run, scripted, Script, Seen};
use tower::{Layer, ServiceExt};
use tower_retry_safety::{Hedge, RetryPolicy};

/// Losers: the hedge wins, the first attempt's future is dropped (cancelled, not left
/// running), its response never reaches the caller; each attempt, hedge included, carries its
/// number for an inner layer.
///
/// Found by the adversarial review of safe hedging and the per-attempt spans (issue 25).
#[tokio::test(start_paused = true)]
async fn the_loser_is_dropped_and_each_attempt_carries_its_number() {
    let policy = RetryPolicy::builder()
        .hedge(Hedge::fixed(Duration::from_millis(10)).max_extra_load(1.0))
        .no_budget()
        .build()
        .unwrap();
    let (res, seen) = run(&policy, get(), |n| {
        if n == 1 {
            (500, Some(200), None)
        } else {
            (2, Some(200), None)
        }
    })
    .await;
    let res = res.unwrap();
    assert_eq!(res.body(), "attempt 2");
    let r = report(&res);
    assert_eq!(
        (r.attempts(), r.hedges(), r.won_by(), r.superseded()),
        (2, 1, Some(2), 1)
    );
    assert_eq!(seen.cancelled.load(Ordering::SeqCst), 1);
    assert_eq!(*seen.numbers.lock().unwrap(), [Some(1), Some(2)]);
    assert_eq!(*seen.at.lock().unwrap(), [0, 10]);
}

/// Nested layers: an inner hedging layer leaves hedging to the outer one — two calls, not
/// four; the inner service sees the outer layer's numbers.
///
/// Found by the adversarial review of safe hedging and the per-attempt spans (issue 25).
#[tokio::test(start_paused = true)]
async fn an_inner_layer_does_not_hedge_again() {
    let hedge = Hedge::fixed(Duration::from_millis(10))
        .max_extra_load(1.0)
        .max_hedges(3);
    let outer = RetryPolicy::builder()
        .hedge(hedge.clone())
        .no_budget()
        .build()
        .unwrap();
    let inner = RetryPolicy::builder()
        .hedge(hedge)
        .max_retries(5)
        .no_budget()
        .build()
        .unwrap();
    // Save tokens in the inner policy: it would hedge if it thought it could.
    for _ in 0..5 {
        run(&inner, get(), fast).await.0.unwrap();
    }
    let seen = Seen::default();
    let svc = outer.layer(inner.layer(scripted(&seen, |n| {
        if n == 1 {
            (500, Some(200), None)
        } else {
            (100, Some(200), None)
        }
    })));
    let res = svc.oneshot(get()).await.unwrap();
    assert_eq!(res.body(), "attempt 2");
    assert_eq!(seen.calls.load(Ordering::SeqCst), 2);
    assert_eq!(*seen.numbers.lock().unwrap(), [Some(1), Some(2)]);
    let r = report(&res);
    assert_eq!((r.hedges(), r.won_by(), r.superseded()), (1, Some(2), 1));
}

/// A per-attempt timeout and a deadline with hedging: attempt 1 is cut at 30 ms while the
/// hedge runs, so attempt 3 goes at once; the sends stay within `1 + max_retries`, and the
/// request ends in a timeout at the deadline, not later.
///
/// Found by the adversarial review of safe hedging and the per-attempt spans (issue 25).
#[tokio::test(start_paused = true)]
async fn timeouts_and_deadline_bound_the_hedged_sends() {
    let policy = RetryPolicy::builder()
        .hedge(Hedge::fixed(Duration::from_millis(10)).max_extra_load(1.0))
        .max_retries(2)
        .attempt_timeout(Duration::from_millis(30))
        .deadline(Duration::from_millis(100))
        .no_budget()
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();
    let (res, seen) = run(&policy, get(), |_| (10_000, Some(200), None)).await;
    let err = res.unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert_eq!(*seen.at.lock().unwrap(), [0, 10, 30]);
    assert_eq!(err.attempts(), 3, "{err}");
    assert!(started.elapsed() <= Duration::from_millis(100));
    // Every attempt was dropped: cut by the clock or superseded.
    assert_eq!(seen.cancelled.load(Ordering::SeqCst), 3);
}

/// Hedges never exceed `max_extra_load` over many slow requests even with `max_hedges(10)`,
/// and count against `max_retries`: 200 requests at 5 % → 10 hedges, 210 calls.
///
/// Found by the adversarial review of safe hedging and the per-attempt spans (issue 25).
#[tokio::test(start_paused = true)]
async fn hedges_stay_within_the_extra_load_with_many_hedges_allowed() {
    let policy = RetryPolicy::builder()
        .hedge(
            Hedge::fixed(Duration::from_millis(10))
                .max_extra_load(0.05)
                .max_hedges(10),
        )
        .max_retries(10)
        .no_budget()
        .build()
        .unwrap();
    let (mut hedges, mut calls) = (0, 0);
    for _ in 0..200 {
        let (res, seen) = run(&policy, get(), |_| (200, Some(200), None)).await;
        hedges += report(&res.unwrap()).hedges();
        calls += seen.calls.load(Ordering::SeqCst);
    }
    assert_eq!((hedges, calls), (10, 210));
}

/// A GET is idempotent by its method; a key its target is trusted to honour makes a repeat no
/// more harmful. `classify_parts` used to rewrite the verdict's source to `IdempotencyKey`, and
/// `Hedger::may_hedge` refuses that source unless `keyed_writes(true)`: adding a trusted key to a
/// read switched hedging off for it (1 call, not 2). A keyed read now keeps its method's verdict.
///
/// Found by the adversarial review of safe hedging and the per-attempt spans (issue 25).
#[tokio::test(start_paused = true)]
async fn a_read_with_a_trusted_key_is_still_hedged() {
    let policy = RetryPolicy::builder()
        .honor_idempotency_key(true)
        .hedge(Hedge::fixed(Duration::from_millis(10)).max_extra_load(1.0))
        .no_budget()
        .build()
        .unwrap();
    let script: Script = |n| {
        if n == 1 {
            (500, Some(200), None)
        } else {
            (2, Some(200), None)
        }
    };
    let (res, seen) = run(&policy, get(), script).await;
    assert_eq!(report(&res.unwrap()).hedges(), 1);
    assert_eq!(seen.calls.load(Ordering::SeqCst), 2);
    let keyed = Request::get("http://api.example/items")
        .header("idempotency-key", "\"read-1\"")
        .body(String::new())
        .unwrap();
    let (res, seen) = run(&policy, keyed, script).await;
    let res = res.unwrap();
    assert_eq!(
        (seen.calls.load(Ordering::SeqCst), report(&res).hedges()),
        (2, 1),
        "{}",
        report(&res)
    );
}

/// Nonsense settings fail `build()`, naming `hedge`.
///
/// Found by the adversarial review of safe hedging and the per-attempt spans (issue 25).
#[test]
fn nonsense_hedge_settings_are_refused() {
    let bad = [
        Hedge::learned().max_extra_load(f64::NAN),
        Hedge::learned().max_extra_load(0.0),
        Hedge::learned().max_extra_load(-0.1),
        Hedge::learned().max_extra_load(1.000_001),
        Hedge::learned().max_extra_load(f64::INFINITY),
        Hedge::learned().min_samples(0),
        Hedge::learned().max_hedges(0),
        Hedge::learned().max_hedges(11),
        Hedge::learned().max_hedges(u32::MAX),
        Hedge::fixed(Duration::ZERO),
    ];
    for hedge in bad {
        let err = RetryPolicy::builder().hedge(hedge.clone()).build();
        assert_eq!(
            err.map(drop).unwrap_err().setting_name(),
            "hedge",
            "{hedge:?}"
        );
    }
}

/// A huge fixed delay is accepted; it must not panic (an `Instant` overflow) and never hedges.
///
/// Found by the adversarial review of safe hedging and the per-attempt spans (issue 25).
#[tokio::test(start_paused = true)]
async fn a_huge_fixed_delay_never_hedges_and_does_not_panic() {
    let policy = RetryPolicy::builder()
        .hedge(Hedge::fixed(Duration::MAX).max_extra_load(1.0))
        .no_budget()
        .build()
        .unwrap();
    let (res, seen) = run(&policy, get(), |_| (1_000, Some(200), None)).await;
    assert_eq!(report(&res.unwrap()).hedges(), 0);
    assert_eq!(seen.calls.load(Ordering::SeqCst), 1);
}
