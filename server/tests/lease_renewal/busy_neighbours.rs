//! Lease renewal from any handler's poll and from a new claim: hundreds of claims on one
//! current-thread runtime, one layer on two runtimes, a released key's slot reused while a
//! neighbour renews. Real sockets on loopback, real clocks (the stores' leases are real time);
//! only exact counts are asserted, never how long something took. From the review of
//! 2026-12-04.

use crate::neighbours_lab::{
    client, conflicts, fresh, keys, post_all, serial, serve, stored_responses, wait_started,
    Counting, Lab, Shared, LEASE,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use retry_safety_testing::runtime_server::{runtime, Flavour};
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};

/// Two hundred claims on one current-thread runtime, each handler busy in 2 ms stretches (a round
/// of every handler is then ~0.4 s, a whole lease, so no claim survives on its own handler's polls
/// alone): held over 4 leases, each key runs once, every repeat during its handler gets 409 (twice:
/// at once and after 4 leases), after it the stored response; the store refuses no renewal (none is
/// sent for a claim whose outcome is stored, on one thread).
///
/// Found by the review of 2026-12-04.
#[test]
fn two_hundred_claims_on_one_thread_each_run_once() {
    let _s = serial();
    let lab = Arc::new(Lab::default());
    let store = Counting::new(MemoryStore::new());
    let shared = Shared(store.clone());
    let (addr, server) = serve(
        Flavour::CurrentThread,
        lab.clone(),
        Duration::from_millis(2),
        move || async move { IdempotencyLayer::new(shared).lease(LEASE) },
    );
    let ks = keys("many", 200);
    let rt = runtime(Flavour::MultiThread);
    rt.block_on(async {
        let client = client();
        let firsts = {
            let (client, ks) = (client.clone(), ks.clone());
            tokio::spawn(async move { post_all(&client, &[addr], &ks).await })
        };
        wait_started(&lab, 200).await;
        let during = post_all(&client, &[addr], &ks).await;
        assert_eq!(conflicts(&during), 200, "{during:?}");
        tokio::time::sleep(LEASE * 4).await;
        let later = post_all(&client, &[addr], &ks).await;
        assert_eq!(conflicts(&later), 200, "{later:?}");
        assert_eq!(lab.total(), 200);
        lab.open.store(true, Ordering::SeqCst);
        let firsts = firsts.await.unwrap();
        assert_eq!(fresh(&firsts), 200);
        let after = post_all(&client, &[addr], &ks).await;
        assert_eq!(stored_responses(&after), 200, "{after:?}");
    });
    drop(server);
    for k in &ks {
        assert_eq!(lab.runs(k), 1, "{k}");
    }
    assert_eq!(store.completed.load(Ordering::SeqCst), 200);
    assert_eq!(store.released.load(Ordering::SeqCst), 0);
    assert_eq!(store.renew_refused.load(Ordering::SeqCst), 0);
    // 200 claims held 4+ leases: renewed at least 4 times each (once per quarter lease).
    assert!(
        store.renewed.load(Ordering::SeqCst) >= 200 * 4 * 3,
        "{}",
        store.renewed.load(Ordering::SeqCst)
    );
}

/// One layer (one store, one `Renewals`) served from a multi-thread and a current-thread runtime at
/// once: 40 keys, half claimed on each; each key's repeats go to the other runtime. Each key runs
/// once; every repeat during gets 409, after 4 leases too; after, the stored response.
///
/// Found by the review of 2026-12-04.
#[test]
fn one_layer_on_two_runtimes_each_key_once() {
    let _s = serial();
    let lab = Arc::new(Lab::default());
    let store = Counting::new(MemoryStore::new());
    let layer = IdempotencyLayer::new(Shared(store.clone())).lease(LEASE);
    let (l1, l2) = (layer.clone(), layer);
    let (a, sa) = serve(
        Flavour::MultiThread,
        lab.clone(),
        Duration::from_millis(30),
        move || async move { l1 },
    );
    let (b, sb) = serve(
        Flavour::CurrentThread,
        lab.clone(),
        Duration::from_millis(30),
        move || async move { l2 },
    );
    let ks = keys("two-rt", 40);
    let rt = runtime(Flavour::MultiThread);
    rt.block_on(async {
        let client = client();
        let firsts = {
            let (client, ks) = (client.clone(), ks.clone());
            tokio::spawn(async move { post_all(&client, &[a, b], &ks).await })
        };
        wait_started(&lab, 40).await;
        let during = post_all(&client, &[b, a], &ks).await;
        assert_eq!(conflicts(&during), 40, "{during:?}");
        tokio::time::sleep(LEASE * 4).await;
        let later = post_all(&client, &[b, a], &ks).await;
        assert_eq!(conflicts(&later), 40, "{later:?}");
        lab.open.store(true, Ordering::SeqCst);
        let firsts = firsts.await.unwrap();
        assert_eq!(fresh(&firsts), 40);
        let after = post_all(&client, &[b, a], &ks).await;
        assert_eq!(stored_responses(&after), 40, "{after:?}");
    });
    drop((sa, sb));
    for k in &ks {
        assert_eq!(lab.runs(k), 1, "{k}");
    }
    assert_eq!(store.completed.load(Ordering::SeqCst), 40);
    assert_eq!(store.released.load(Ordering::SeqCst), 0);
}

/// A key whose first run answers a declined 503 (`store_server_errors(false)`: the key is
/// released), then claimed again by its repeat while 20 neighbours stay busy on the same
/// current-thread runtime renewing every due slot (the released claim's slot and heap entry
/// are reused by later claims). The re-claimed key runs exactly twice in all (the declined run
/// and one more), its repeats during the second run get 409 (also after 4 leases); the
/// neighbours run once each; the released claim's stale renewal is never accepted.
///
/// Found by the review of 2026-12-04.
#[test]
fn a_released_key_reclaimed_while_neighbours_renew_runs_once_more() {
    let _s = serial();
    let lab = Arc::new(Lab::default());
    let reused = keys("reused", 5);
    lab.fail_first
        .lock()
        .unwrap()
        .extend(reused.iter().cloned());
    let store = Counting::new(MemoryStore::new());
    let shared = Shared(store.clone());
    let (addr, server) = serve(
        Flavour::CurrentThread,
        lab.clone(),
        Duration::from_millis(5),
        move || async move {
            IdempotencyLayer::new(shared)
                .lease(LEASE)
                .store_server_errors(false)
        },
    );
    let neighbours = keys("neighbour", 20);
    let rt = runtime(Flavour::MultiThread);
    rt.block_on(async {
        let client = client();
        let n_firsts = {
            let (client, ks) = (client.clone(), neighbours.clone());
            tokio::spawn(async move { post_all(&client, &[addr], &ks).await })
        };
        wait_started(&lab, 20).await;
        // Past a quarter lease: the neighbours' entries are due and renewed by each other.
        tokio::time::sleep(LEASE / 2).await;
        let declined = post_all(&client, &[addr], &reused).await;
        assert_eq!(
            declined
                .iter()
                .filter(|(s, _)| *s == StatusCode::SERVICE_UNAVAILABLE)
                .count(),
            5,
            "{declined:?}"
        );
        assert_eq!(store.released.load(Ordering::SeqCst), 5);
        let seconds = {
            let (client, ks) = (client.clone(), reused.clone());
            tokio::spawn(async move { post_all(&client, &[addr], &ks).await })
        };
        wait_started(&lab, 30).await;
        let during = post_all(&client, &[addr], &reused).await;
        assert_eq!(conflicts(&during), 5, "{during:?}");
        tokio::time::sleep(LEASE * 4).await;
        let later = post_all(&client, &[addr], &reused).await;
        assert_eq!(conflicts(&later), 5, "{later:?}");
        let later_n = post_all(&client, &[addr], &neighbours).await;
        assert_eq!(conflicts(&later_n), 20, "{later_n:?}");
        lab.open.store(true, Ordering::SeqCst);
        let seconds = seconds.await.unwrap();
        assert_eq!(fresh(&seconds), 5);
        let n_firsts = n_firsts.await.unwrap();
        assert_eq!(fresh(&n_firsts), 20);
    });
    drop(server);
    for k in &reused {
        assert_eq!(lab.runs(k), 2, "{k}");
    }
    for k in &neighbours {
        assert_eq!(lab.runs(k), 1, "{k}");
    }
    assert_eq!(store.completed.load(Ordering::SeqCst), 25);
    assert_eq!(store.released.load(Ordering::SeqCst), 5);
    assert_eq!(store.renew_refused.load(Ordering::SeqCst), 0);
}
