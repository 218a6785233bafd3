//! A renewal that arrives late (sent from a neighbour's task, or the ticker, after the claim's
//! outcome was stored or its key released): every store refuses it and changes nothing. From
//! the review of 2026-12-04.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use tower_idempotency_keys::{
    stores::MemoryStore, Begin, Entry, FencingToken, Fingerprint, IdempotencyStore, StoredResponse,
};

// ---------------------------------------------------------------------------------------
// 1b. A renewal that arrives late (sent from a neighbour's task, or the ticker, after the
//     claim's outcome was stored or its key released): every store refuses it and changes
//     nothing. Real leases and TTLs, waited out; nothing is timed.
// ---------------------------------------------------------------------------------------

fn fp() -> Fingerprint {
    Fingerprint::of(&Method::POST, "/v1/writes", b"{}")
}

async fn claim_of<S: IdempotencyStore>(store: &S, key: &str, lease: Duration) -> FencingToken {
    match store.begin(key, fp(), lease).await.unwrap() {
        Begin::Started(c) => c,
        other => panic!("{key}: expected a claim, got {other:?}"),
    }
}

/// Per store: (1) a renewal after `complete` is refused as fenced, leaves the entry as it was
/// and does not extend it (a 400 ms TTL still ends); (2) after `release`, refused, and the key
/// stays free (the next `begin` starts); (3) after release and a new claim by another request,
/// the old claim's renewal is refused and the new claim's lease is its own (it ends when not
/// renewed, 400 ms).
async fn late_renewals_change_nothing<S: IdempotencyStore>(store: S, ns: &str) {
    let key = |n: &str| format!("{ns}{n}");
    let ttl = Duration::from_millis(400);
    let long = Duration::from_secs(60);

    let c = claim_of(&store, &key("done"), long).await;
    let response = StoredResponse::new(
        StatusCode::CREATED,
        HeaderMap::new(),
        Bytes::from_static(b"ok"),
    );
    store
        .complete(&key("done"), c, fp(), response.clone(), ttl)
        .await
        .unwrap();
    let err = store.renew(&key("done"), c, long).await.unwrap_err();
    assert!(err.is_fenced(), "{err}");
    assert_eq!(
        store.get(&key("done")).await.unwrap(),
        Some(Entry::Completed {
            fingerprint: fp(),
            response
        })
    );
    tokio::time::sleep(ttl * 3).await;
    assert_eq!(
        store.get(&key("done")).await.unwrap(),
        None,
        "the renewal extended a completed entry"
    );

    let c = claim_of(&store, &key("freed"), long).await;
    store.release(&key("freed"), c).await.unwrap();
    assert!(store
        .renew(&key("freed"), c, long)
        .await
        .unwrap_err()
        .is_fenced());
    assert_eq!(
        store.get(&key("freed")).await.unwrap(),
        None,
        "the renewal resurrected a released key"
    );
    let again = claim_of(&store, &key("freed"), ttl).await;
    assert_ne!(again, c);
    assert!(store
        .renew(&key("freed"), c, long)
        .await
        .unwrap_err()
        .is_fenced());
    tokio::time::sleep(ttl * 3).await;
    assert_eq!(
        store.get(&key("freed")).await.unwrap(),
        None,
        "the stale renewal extended the new claim"
    );
}

/// Found by the review of 2026-12-04.
#[tokio::test]
async fn memory_store_refuses_late_renewals() {
    late_renewals_change_nothing(MemoryStore::new(), "late:").await;
}

/// Found by the review of 2026-12-04.
#[tokio::test]
async fn redis_store_refuses_late_renewals() {
    use tower_idempotency_keys::stores::RedisStore;
    // Deletes every key under the test's prefix when it ends, also when it fails.
    let redis = retry_safety_testing::redis::TestRedis::start("late-renewals");
    let store = RedisStore::connect(redis.url())
        .await
        .expect("the test's Redis")
        .prefix(redis.prefix().to_owned());
    late_renewals_change_nothing(store, "k:").await;
}

/// Found by the review of 2026-12-04.
#[tokio::test]
async fn postgres_store_refuses_late_renewals() {
    use tower_idempotency_keys::stores::PostgresStore;
    let db = crate::pg::TestDb::new().await;
    let store = PostgresStore::from_pool(db.pool(4).await);
    store.migrate().await.unwrap();
    late_renewals_change_nothing(store, "k:").await;
}
