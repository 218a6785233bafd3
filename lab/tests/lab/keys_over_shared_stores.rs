//! The key conformance check against `IdempotencyLayer` over the shared stores: Redis (keys
//! under a prefix of the test's own, deleted when it ends) and PostgreSQL (a schema of its
//! own, dropped when it ends). Run with `cargo test -p retry-safety-lab`.

use std::net::{Ipv4Addr, SocketAddr};

use retry_safety_lab::{KeysCheck, KeysReport, RuleVerdict, Upstream};
use tower_idempotency_keys::IdempotencyLayer;

fn loopback() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, 0))
}

fn assert_every_rule_passes(report: &KeysReport) {
    assert_eq!(report.results.len(), 8, "{report}");
    for result in &report.results {
        assert_eq!(result.verdict, RuleVerdict::Pass, "{report}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crates_layer_over_redis_passes_every_rule() {
    use tower_idempotency_keys::stores::RedisStore;
    // Declared first, dropped last: its keys are deleted even when an assertion fails.
    let redis = crate::support::redis::TestRedis::start("lab-keys");
    let store = RedisStore::connect(redis.url())
        .await
        .expect("the test's Redis answered PING")
        .prefix(redis.prefix());
    let upstream = Upstream::start_with(loopback(), IdempotencyLayer::new(store))
        .await
        .expect("upstream");
    let report = KeysCheck::new(&format!("http://{}", upstream.addr()), "POST /v1/payments")
        .expect("valid check")
        .run()
        .await;
    assert_every_rule_passes(&report);
    assert_eq!(upstream.handler_runs(), 8, "{report}");
    drop(upstream);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crates_layer_over_postgres_passes_every_rule() {
    use tower_idempotency_keys::stores::PostgresStore;
    // A schema of the test's own, dropped when `db` is, also when an assertion fails.
    let db = crate::pg::TestDb::new().await;
    let store = PostgresStore::from_pool(db.pool(16).await);
    store.migrate().await.expect("the store's table");
    let upstream = Upstream::start_with(loopback(), IdempotencyLayer::new(store.clone()))
        .await
        .expect("upstream");
    let report = KeysCheck::new(&format!("http://{}", upstream.addr()), "POST /v1/payments")
        .expect("valid check")
        .run()
        .await;
    assert_every_rule_passes(&report);
    assert_eq!(upstream.handler_runs(), 8, "{report}");
    drop(upstream);
    store.pool().close().await;
}
