//! Handlers and stores sharing one pool, on real PostgreSQL and real sockets: a session-level
//! `search_path` left on a reused connection, two stores on one pool, lease renewals starved
//! by handlers holding the pool. Handlers count their side effects; counts are exact. From
//! the review, round 2, of the PostgreSQL store's atomic/lease modes (ac4e316).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::keyed_request::{key_of, Req};
use crate::pg::{client, fresh, post, serve, TestDb};
use bytes::Bytes;
use http::Response;
use http_body_util::Full;
use tower::{service_fn, BoxError, ServiceBuilder};
use tower_idempotency_keys::{stores::PostgresStore, IdempotencyLayer, KeyTransaction};

// HELD. A handler sets search_path at session level (not LOCAL) to a schema with its own
// `idempotency_keys` table; the pooled connection (pool of 1) is reused by the next requests:
// entries still go to the store's schema, one run.
/// Found by the adversarial review, round 2, of the PostgreSQL store's modes.
#[tokio::test]
async fn session_level_search_path_on_a_reused_connection() {
    let db = TestDb::new().await;
    let pool = db.pool(1).await;
    let store = PostgresStore::from_pool(pool.clone());
    store.migrate().await.unwrap();
    let decoy = fresh("decoy");
    sqlx::raw_sql(&format!(
        "CREATE SCHEMA {decoy}; CREATE TABLE {decoy}.idempotency_keys (LIKE idempotency_keys INCLUDING ALL); CREATE TABLE {decoy}.orders (LIKE orders INCLUDING ALL)"
    ))
    .execute(&pool)
    .await
    .unwrap();
    // Dropped at the end also when an assert fails (the test drops it itself first).
    let _decoy_schema = crate::pg::ExtraSchema::guard(&db, &decoy);
    let runs = Arc::new(AtomicU32::new(0));
    let (r, d) = (runs.clone(), decoy.clone());
    let svc = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store).atomic())
        .service(service_fn(move |req: Req| {
            let (r, d) = (r.clone(), d.clone());
            async move {
                r.fetch_add(1, Ordering::SeqCst);
                let key = key_of(&req);
                let tx = KeyTransaction::of(&req).unwrap().clone();
                let mut conn = tx.acquire().await?;
                sqlx::query("INSERT INTO orders (key, note) VALUES ($1, 'x')")
                    .bind(&key)
                    .execute(&mut *conn)
                    .await?;
                // Session level: survives the transaction (SET inside a transaction that
                // commits stays for the session).
                let set = format!("SET search_path TO {d}");
                sqlx::query(&set).execute(&mut *conn).await?;
                Ok::<_, BoxError>(Response::new(Full::new(Bytes::from_static(b"ok"))))
            }
        }));
    let addr = serve(svc).await;
    let c = client();
    let key = fresh("k");
    let first = post(&c, addr, "/orders", &key, "x").await.unwrap();
    let second = post(&c, addr, "/orders", &key, "x").await.unwrap();
    let third = post(&c, addr, "/orders", &key, "x").await.unwrap();
    drop(pool);
    let n = db
        .count(&format!("SELECT count(*) FROM orders WHERE key = '{key}'"))
        .await;
    let decoy_rows = db
        .count(&format!("SELECT count(*) FROM {decoy}.idempotency_keys"))
        .await;
    let pool = db.pool(1).await;
    sqlx::raw_sql(&format!("DROP SCHEMA {decoy} CASCADE"))
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(
        (n, runs.load(Ordering::SeqCst), decoy_rows),
        (1, 1, 0),
        "{first:?} {second:?} {third:?}"
    );
    assert!(
        second.1 && third.1,
        "stored responses: {second:?} {third:?}"
    );
}

// DEFECT. Two stores over one pool (the application's pool, handed to `from_pool` twice: one
// router per service, a lease-mode and an atomic-mode layer built separately, or a store made
// lazily). The second store reads its schema with `SELECT current_schema()` on whatever pooled
// connection it gets, at its first request — a connection that an atomic-mode handler of the
// first store left with a session-level `search_path` (a tenant's schema with its own copy of
// the table, e.g. from a per-tenant migration). The second store then keeps its entries in the
// tenant's table: the two stores no longer see each other's keys, and a key the first store
// completed runs again through the second. Seen: orders 2, runs 2.
//
// Proposed fix: never take the schema from a pooled connection's live state. Read it from the
// pool's connect options (`search_path` option, else the server default for a fresh session)
// or on a fresh connection (`pool.connect_options()` + `PgConnection::connect_with`) that no
// handler has touched; or require `PostgresStore::schema` when the pool is shared.
/// Found by the adversarial review, round 2, of the PostgreSQL store's modes.
#[tokio::test]
async fn a_second_store_on_the_same_pool_reads_a_handlers_search_path() {
    let db = TestDb::new().await;
    let pool = db.pool(1).await;
    let first_store = PostgresStore::from_pool(pool.clone());
    first_store.migrate().await.unwrap();
    let tenant = fresh("tenant");
    sqlx::raw_sql(&format!(
        "CREATE SCHEMA {tenant}; CREATE TABLE {tenant}.idempotency_keys (LIKE idempotency_keys INCLUDING ALL)"
    ))
    .execute(&pool)
    .await
    .unwrap();
    // Dropped at the end also when an assert fails (the test drops it itself first).
    let _tenant_schema = crate::pg::ExtraSchema::guard(&db, &tenant);
    let runs = Arc::new(AtomicU32::new(0));
    let (r, t) = (runs.clone(), tenant.clone());
    let atomic = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(first_store).atomic())
        .service(service_fn(move |req| {
            sets_session_search_path(r.clone(), t.clone(), req)
        }));
    // The second store: lease mode over the same pool, its handler writing in its own
    // transaction-less way (through the pool, qualified).
    let second_store = PostgresStore::from_pool(pool.clone());
    let (r2, p2, s2) = (runs.clone(), pool.clone(), db.schema.clone());
    let lease = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(second_store))
        .service(service_fn(move |req| {
            writes_through_pool(r2.clone(), p2.clone(), s2.clone(), req)
        }));
    let (a, l) = (serve(atomic).await, serve(lease).await);
    let c = client();
    let key = fresh("k");
    let first = post(&c, a, "/orders", &key, "x").await.unwrap();
    let second = post(&c, l, "/orders", &key, "x").await.unwrap();
    let n = db
        .count(&format!("SELECT count(*) FROM orders WHERE key = '{key}'"))
        .await;
    let in_tenant = db
        .count(&format!("SELECT count(*) FROM {tenant}.idempotency_keys"))
        .await;
    drop(pool);
    let admin = db.pool(1).await;
    sqlx::raw_sql(&format!("DROP SCHEMA {tenant} CASCADE"))
        .execute(&admin)
        .await
        .unwrap();
    assert_eq!(
        (n, runs.load(Ordering::SeqCst)),
        (1, 1),
        "first {first:?}, same key through the second store {second:?}; entries in the tenant's table: {in_tenant}"
    );
}

/// A lease-mode handler that holds a pooled connection (its own transaction) for 1.5 s, then
/// works 1 s more.
async fn holds_a_connection(
    p: sqlx::PgPool,
    r: Arc<AtomicU32>,
    req: Req,
) -> Result<Response<Full<Bytes>>, BoxError> {
    r.fetch_add(1, Ordering::SeqCst);
    let key = key_of(&req);
    let mut tx = p.begin().await?;
    sqlx::query("INSERT INTO orders (key, note) VALUES ($1, 'x')")
        .bind(&key)
        .execute(&mut *tx)
        .await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    tx.commit().await?;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

/// An atomic-mode handler that writes its order, then sets the session's `search_path` to
/// `tenant` (not LOCAL: it outlives the transaction, on the pooled connection).
async fn sets_session_search_path(
    r: Arc<AtomicU32>,
    tenant: String,
    req: Req,
) -> Result<Response<Full<Bytes>>, BoxError> {
    r.fetch_add(1, Ordering::SeqCst);
    let key = key_of(&req);
    let tx = KeyTransaction::of(&req).unwrap().clone();
    let mut conn = tx.acquire().await?;
    sqlx::query("INSERT INTO orders (key, note) VALUES ($1, 'x')")
        .bind(&key)
        .execute(&mut *conn)
        .await?;
    let set = format!("SET search_path TO {tenant}, public");
    sqlx::query(&set).execute(&mut *conn).await?;
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

/// A lease-mode handler writing its order through the pool into `schema`.
async fn writes_through_pool(
    r: Arc<AtomicU32>,
    p: sqlx::PgPool,
    schema: String,
    req: Req,
) -> Result<Response<Full<Bytes>>, BoxError> {
    r.fetch_add(1, Ordering::SeqCst);
    let key = key_of(&req);
    sqlx::query(&format!(
        "INSERT INTO {schema}.orders (key, note) VALUES ($1, 'y')"
    ))
    .bind(&key)
    .execute(&p)
    .await?;
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

// DEFECT (lease mode). Renewals, like claims, take a connection from the store's pool — the
// application's pool, as `from_pool` invites ("a store over a pool of your own"). Handlers
// that hold pooled connections (their own transactions; or atomic-mode requests on the same
// pool, one connection each for their whole run) for longer than a lease starve every renewal:
// each waits for a connection, times out after a quarter lease, and the claims lapse while
// their handlers are still running. Once a connection frees up, a repeat claims the expired
// key and runs the handler a second time. Here: pool of 2, lease 600 ms, two handlers each
// holding a transaction for 1.5 s, then working 1 s more; a repeat at 1.8 s runs again. Seen:
// runs 3, orders 3 (2 expected); the repeat gets 200 instead of 409. The docs' windows name "the
// store unreachable for longer than the lease": here the store is up and the crate's own
// renewals are queued behind the handlers it is guarding.
//
// Proposed fix: renew (and complete) over a connection the store keeps for itself, not from
// the shared pool — e.g. one dedicated `PgConnection` (reconnected on error) opened from
// `pool.connect_options()` at the first claim, renewing every due claim of the tick in one
// `UPDATE … WHERE (key, claim) IN (…)`; at the least, document that lease mode needs a pool
// its handlers never hold and make `PostgresStore::connect`'s pool private to the store.
/// Found by the adversarial review, round 2, of the PostgreSQL store's modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_mode_renewals_starve_when_handlers_hold_the_pool() {
    let db = TestDb::new().await;
    let pool = db.pool(2).await;
    let store = PostgresStore::from_pool(pool.clone());
    store.migrate().await.unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let (r, p) = (runs.clone(), pool.clone());
    let svc = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store).lease(Duration::from_millis(600)))
        .service(service_fn(move |req| {
            holds_a_connection(p.clone(), r.clone(), req)
        }));
    let addr = serve(svc).await;
    let c = client();
    let (k1, k2) = (fresh("k1"), fresh("k2"));
    let firsts: Vec<_> = [k1.clone(), k2.clone()]
        .into_iter()
        .map(|k| {
            let c = c.clone();
            tokio::spawn(async move { post(&c, addr, "/orders", &k, "x").await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let repeat = post(&c, addr, "/orders", &k1, "x").await;
    for f in firsts {
        let _ = f.await.unwrap();
    }
    // Let a second run, if any, finish.
    tokio::time::sleep(Duration::from_millis(2800)).await;
    let n = db.count("SELECT count(*) FROM orders").await;
    assert_eq!(
        (n, runs.load(Ordering::SeqCst)),
        (2, 2),
        "repeat of k1 at 1.8 s (its handler still running): {repeat:?}"
    );
}
