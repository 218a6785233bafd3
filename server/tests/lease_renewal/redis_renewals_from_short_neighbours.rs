//! Lease renewal from short neighbours' tasks: `RedisStore` renewals of long claims sent from
//! the tasks of short keyed requests that come and go on the same current-thread runtime. Real
//! sockets on loopback, a real Redis, real clocks (Redis keeps a lease in its own real time);
//! only exact counts are asserted, never how long something took. From the review of
//! 2026-12-04.

use crate::neighbours_lab::{
    client, conflicts, fresh, keys, post_all, serial, serve, stored_responses, wait_started, Lab,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use retry_safety_testing::redis::TestRedis;
use retry_safety_testing::runtime_server::{runtime, Flavour};
use tower_idempotency_keys::{stores::RedisStore, IdempotencyLayer};

/// This test's time unit. Redis keeps a lease in its own real time, so no paused clock can
/// stand in for it: each renewal must reach Redis within a lease of the one before. On the
/// server's one thread, shared with ten busy handlers and redis-rs's connection task, a
/// renewal goes out up to a third of a lease after the last (a quarter and a tick) plus a
/// stretch for the task that sends it and one for the connection task that writes it. With
/// the 400 ms lease and 20 ms stretches this test once had, that left about 200 ms for
/// everything else on the machine: one stall of the server thread or of redis-server that
/// long (three builds beside it on two cores) and a claim lapsed, its repeat ran the handler
/// a second time, and the test failed. The timeline was then made five times as long (lease
/// 2 s, stretches 100 ms, the store's response timeout 5 s, the waits counted in leases),
/// and it failed again with three builds beside it: ten busy handlers make a round of the
/// thread 1 s, so a renewal could go out 0.5 s + two rounds after the last, and a second
/// of stall lapsed a claim (whose repeat then ran the long handler again, seen as a post
/// that never answered). Now four long handlers (a round of 0.4 s) and a 4 s lease: a
/// renewal reaches Redis at most about 1.3 s after the last, and the thread has to stall
/// for over 2.5 s for a claim to lapse. The same shape and the same assertions, per key.
const LEASE: Duration = Duration::from_secs(4);
/// Long claims: each is one busy handler on the server's one thread.
const LONG: usize = 4;
const STRETCH: Duration = Duration::from_millis(100);
/// `RedisStore::connect`'s 1 s, scaled with the rest: a reply waits for a round of the busy
/// handlers (1 s here) before redis-rs's connection task reads it.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// RedisStore on a current-thread runtime: 4 long claims (handlers busy in stretches of
/// 0.025 lease) while 60 short keyed requests come and go; the short handlers' tasks renew
/// the long claims (the renewal's reply is awaited from a task spawned from theirs) and
/// end. Each key runs once; the long keys' repeats get 409 at once and after 3 leases;
/// after, stored responses. The keys are deleted when the test ends, passed or failed.
///
/// Found by the review of 2026-12-04.
#[test]
fn redis_renewals_from_short_neighbours_keep_long_claims() {
    let _s = serial();
    // Dropped last: deletes every key under the test's prefix, also when an assert fails.
    let redis = TestRedis::start("renewals-from-short-neighbours");
    let lab = Arc::new(Lab::default());
    let long = keys("long", LONG);
    let short = keys("short", 60);
    lab.short.lock().unwrap().extend(short.iter().cloned());
    let (url, p) = (redis.url().to_owned(), redis.prefix().to_owned());
    let (addr, server) = serve(
        Flavour::CurrentThread,
        lab.clone(),
        STRETCH,
        move || async move {
            let store = RedisStore::connect_with(&url, RESPONSE_TIMEOUT)
                .await
                .expect("the test's Redis")
                .prefix(p);
            IdempotencyLayer::new(store).lease(LEASE)
        },
    );
    let rt = runtime(Flavour::MultiThread);
    rt.block_on(async {
        let client = client();
        let firsts = {
            let (client, ks) = (client.clone(), long.clone());
            tokio::spawn(async move { post_all(&client, &[addr], &ks).await })
        };
        wait_started(&lab, LONG).await;
        let during = post_all(&client, &[addr], &long).await;
        assert_eq!(conflicts(&during), LONG, "{during:?}");
        // Short requests in waves over 3 leases.
        for wave in short.chunks(10) {
            let done = post_all(&client, &[addr], wave).await;
            assert_eq!(fresh(&done), 10, "{done:?}");
            tokio::time::sleep(LEASE / 2).await;
        }
        let later = post_all(&client, &[addr], &long).await;
        assert_eq!(conflicts(&later), LONG, "{later:?}");
        lab.open.store(true, Ordering::SeqCst);
        let firsts = firsts.await.unwrap();
        assert_eq!(fresh(&firsts), LONG);
        let after = post_all(&client, &[addr], &long).await;
        assert_eq!(stored_responses(&after), LONG, "{after:?}");
    });
    drop(server);
    for k in long.iter().chain(short.iter()) {
        assert_eq!(lab.runs(k), 1, "{k}");
    }
}
