//! One contract, every store: what `IdempotencyLayer` relies on, checked against
//! `MemoryStore` and (feature `redis`) `RedisStore` on the test's Redis (`REDIS_URL`, else
//! 127.0.0.1:6379, else a `redis-server` of its own: `testing/src/redis/`).
//! Leases and TTLs are short and real: the checks wait them out, they never time anything.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use tower_idempotency_keys::{
    stores::MemoryStore, Begin, Entry, FencingToken, Fingerprint, IdempotencyStore, StoredResponse,
};

const LONG: Duration = Duration::from_secs(60);
const SHORT: Duration = Duration::from_millis(200);

fn fp(body: &str) -> Fingerprint {
    Fingerprint::of(&http::Method::POST, "/v1/send?to=a", body.as_bytes())
}

fn response() -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.append("set-cookie", HeaderValue::from_static("a=1"));
    headers.append("set-cookie", HeaderValue::from_static("b=2"));
    headers.insert(
        "x-bin",
        HeaderValue::from_bytes(b"\x80\xfe opaque").unwrap(),
    );
    let body = Bytes::from((0..=255u8).cycle().take(5000).collect::<Vec<_>>());
    StoredResponse::new(StatusCode::CREATED, headers, body)
}

async fn claim<S: IdempotencyStore>(store: &S, key: &str, lease: Duration) -> FencingToken {
    match store.begin(key, fp("x"), lease).await.unwrap() {
        Begin::Started(token) => token,
        other => panic!("{key}: expected a claim, got {other:?}"),
    }
}

/// FencingToken is exclusive under 64 concurrent callers.
async fn one_claim_among_concurrent_callers<S: IdempotencyStore>(store: &Arc<S>, key: &str) {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (store, k) = (store.clone(), key.to_owned());
        tasks.spawn(async move { store.begin(&k, fp("x"), LONG).await.unwrap() });
    }
    let (mut started, mut in_flight) = (0, 0);
    while let Some(done) = tasks.join_next().await {
        match done.unwrap() {
            Begin::Started(_) => started += 1,
            Begin::Existing(Entry::InFlight { fingerprint }) => {
                assert_eq!(fingerprint, fp("x"));
                in_flight += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((started, in_flight), (1, 63));
}

/// Entries round-trip byte for byte, and a completed key answers with its entry.
async fn entries_round_trip<S: IdempotencyStore>(store: &S, key: &str) {
    let c = claim(store, key, LONG).await;
    store
        .complete(key, c, fp("x"), response(), LONG)
        .await
        .unwrap();
    let expected = Entry::Completed {
        fingerprint: fp("x"),
        response: response(),
    };
    assert_eq!(store.get(key).await.unwrap(), Some(expected.clone()));
    assert_eq!(
        store.begin(key, fp("other"), LONG).await.unwrap(),
        Begin::Existing(expected)
    );
    // A completed key is no claim's any more.
    assert!(store.release(key, c).await.unwrap_err().is_fenced());
}

/// Fencing refuses a stale owner: its lease ended and another request claimed the key.
async fn fencing_refuses_a_stale_owner<S: IdempotencyStore>(store: &S, key: &str) {
    let stale = claim(store, key, SHORT).await;
    tokio::time::sleep(SHORT * 2).await;
    let fresh = claim(store, key, LONG).await;
    assert_ne!(stale, fresh);
    assert!(store.renew(key, stale, LONG).await.unwrap_err().is_fenced());
    assert!(store
        .complete(key, stale, fp("x"), response(), LONG)
        .await
        .unwrap_err()
        .is_fenced());
    assert!(store.release(key, stale).await.unwrap_err().is_fenced());
    assert_eq!(
        store.get(key).await.unwrap(),
        Some(Entry::InFlight {
            fingerprint: fp("x")
        }),
        "the stale owner changed nothing"
    );
    store
        .complete(key, fresh, fp("x"), response(), LONG)
        .await
        .unwrap();
}

/// Leases renew, and end when not renewed.
async fn leases_renew_and_end_unrenewed<S: IdempotencyStore>(store: &S, key: &str) {
    let c = claim(store, key, SHORT).await;
    for _ in 0..4 {
        tokio::time::sleep(SHORT / 2).await;
        store.renew(key, c, SHORT).await.unwrap();
    }
    assert!(matches!(
        store.get(key).await.unwrap(),
        Some(Entry::InFlight { .. })
    ));
    tokio::time::sleep(SHORT * 2).await;
    assert_eq!(store.get(key).await.unwrap(), None);
    claim(store, key, LONG).await;
}

/// A claim whose lease ran out with no other claim since still completes: its handler ran,
/// and its outcome is kept rather than lost (a repeat would run the handler again).
async fn a_lapsed_claim_still_completes<S: IdempotencyStore>(store: &S, key: &str) {
    let lapsed = claim(store, key, SHORT).await;
    tokio::time::sleep(SHORT * 2).await;
    store
        .complete(key, lapsed, fp("x"), response(), LONG)
        .await
        .unwrap();
    assert_eq!(
        store.get(key).await.unwrap(),
        Some(Entry::Completed {
            fingerprint: fp("x"),
            response: response(),
        })
    );
    // But not over another claim's completed entry.
    assert!(store
        .complete(key, FencingToken::new(), fp("x"), response(), LONG)
        .await
        .unwrap_err()
        .is_fenced());
    // The same claim's completion sent again is fenced or writes the same entry (a store that
    // confirms writes on replicas sends an unconfirmed completion again).
    let again = store.complete(key, lapsed, fp("x"), response(), LONG).await;
    assert!(
        again.as_ref().map_or_else(|e| e.is_fenced(), |()| true),
        "{again:?}"
    );
    assert_eq!(
        store.get(key).await.unwrap(),
        Some(Entry::Completed {
            fingerprint: fp("x"),
            response: response(),
        })
    );
}

/// Completed entries expire with their TTL.
async fn entries_expire_with_their_ttl<S: IdempotencyStore>(store: &S, key: &str) {
    let c = claim(store, key, LONG).await;
    store
        .complete(key, c, fp("x"), response(), SHORT)
        .await
        .unwrap();
    assert!(store.get(key).await.unwrap().is_some());
    tokio::time::sleep(SHORT * 2).await;
    assert_eq!(store.get(key).await.unwrap(), None);
}

/// Release by the owner frees the key; keys are independent (`other` stays claimed).
async fn release_frees_the_key<S: IdempotencyStore>(store: &S, key: &str, other: &str) {
    let c = claim(store, key, LONG).await;
    claim(store, other, LONG).await;
    store.release(key, c).await.unwrap();
    assert_eq!(store.get(key).await.unwrap(), None);
    claim(store, key, LONG).await;
}

/// Every check, on keys under `ns` (a namespace fresh for this run).
async fn contract<S: IdempotencyStore>(store: S, ns: &str) {
    let store = Arc::new(store);
    let key = |name: &str| format!("{ns}{name}");
    one_claim_among_concurrent_callers(&store, &key("race")).await;
    entries_round_trip(&*store, &key("rt")).await;
    fencing_refuses_a_stale_owner(&*store, &key("fence")).await;
    leases_renew_and_end_unrenewed(&*store, &key("lease")).await;
    a_lapsed_claim_still_completes(&*store, &key("lapsed")).await;
    entries_expire_with_their_ttl(&*store, &key("ttl")).await;
    release_frees_the_key(&*store, &key("free"), &key("free-2")).await;
}

#[tokio::test]
async fn memory_store_keeps_the_contract() {
    contract(MemoryStore::new(), "").await;
}

#[tokio::test]
async fn redis_store_keeps_the_contract() {
    use tower_idempotency_keys::stores::RedisStore;
    // REDIS_URL, else 127.0.0.1:6379, else a redis-server of its own; its keys are deleted
    // when it ends.
    let redis = retry_safety_testing::redis::TestRedis::start("contract");
    let store = RedisStore::connect(redis.url())
        .await
        .expect("the test's Redis answered PING");
    contract(store.prefix(redis.prefix()), "").await;
    drop(redis);
}

/// On a schema of its own (dropped at the end), on the PostgreSQL at `DATABASE_URL` or
/// 127.0.0.1:5432.
#[tokio::test]
async fn postgres_store_keeps_the_contract() {
    use tower_idempotency_keys::stores::PostgresStore;
    let db = crate::pg::TestDb::new().await;
    let store = PostgresStore::from_pool(db.pool(16).await);
    store.migrate().await.unwrap();
    // A second run of the migration changes nothing.
    store.migrate().await.unwrap();
    contract(store.clone(), "").await;

    // Expired rows do not pile up: 1,000 short-lived claims, then claims enough to sweep.
    for i in 0..1000 {
        claim(&store, &format!("short-{i}"), Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    for i in 0..1024 {
        claim(&store, &format!("sweep-{i}"), LONG).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let expired = db
        .count("SELECT count(*) FROM idempotency_keys WHERE expires_at <= clock_timestamp()")
        .await;
    assert!(expired <= 256, "{expired} expired rows left");
    assert!(store.purge_expired(10_000).await.unwrap() <= 256);
    assert_eq!(
        db.count("SELECT count(*) FROM idempotency_keys WHERE expires_at <= clock_timestamp()")
            .await,
        0
    );
}
