//! Adversarial review of the PostgreSQL store (issue 21): real PostgreSQL, real sockets, handlers
//! that count their side effects. Each test is a defect the review found, each applied a write
//! twice or held a key for good before its fix.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::pg::{client, fresh, post, serve, TestDb};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use tower::{service_fn, BoxError, ServiceBuilder};
use tower_idempotency_keys::{stores::PostgresStore, IdempotencyLayer, KeyTransaction, RequestKey};

type Req = Request<Either<Full<Bytes>, Incoming>>;

fn created(text: String) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(Bytes::from(text)));
    *res.status_mut() = StatusCode::CREATED;
    res
}

/// An atomic-mode handler that writes its order, then ends the transaction itself with
/// `COMMIT` (the misuse the layer promises to report, "never a second run"), then takes a
/// while to answer.
async fn commits_then_slow(
    runs: Arc<AtomicU32>,
    req: Req,
) -> Result<Response<Full<Bytes>>, BoxError> {
    runs.fetch_add(1, Ordering::SeqCst);
    let key = req
        .extensions()
        .get::<RequestKey>()
        .unwrap()
        .as_str()
        .to_owned();
    let tx = KeyTransaction::of(&req).unwrap().clone();
    let mut conn = tx.acquire().await?;
    sqlx::query("INSERT INTO orders (key, note) VALUES ($1, 'x')")
        .bind(&key)
        .execute(&mut *conn)
        .await?;
    sqlx::query("COMMIT").execute(&mut *conn).await?;
    drop(conn);
    tokio::time::sleep(Duration::from_millis(600)).await;
    Ok(created("done".into()))
}

// A handler that COMMITs by hand releases the key's advisory lock at once, but the layer writes
// its \"unknown outcome\" entry only after the handler returns: a repeat in between runs the
// handler a second time and its write is applied twice (the docs and issue promise "never a
// second run").
/// Found by the adversarial review of the PostgreSQL store (issue 21).
#[tokio::test]
async fn commit_by_hand_then_slow_answer_lets_a_repeat_run_twice() {
    let db = TestDb::new().await;
    let store = PostgresStore::from_pool(db.pool(8).await);
    store.migrate().await.unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let svc = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store).atomic())
        .service(service_fn(move |req| commits_then_slow(r.clone(), req)));
    let addr = serve(svc).await;
    let c = client();
    let key = fresh("k");
    let first = {
        let (c, key) = (c.clone(), key.clone());
        tokio::spawn(async move { post(&c, addr, "/orders", &key, "x").await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(250)).await;
    let repeat = post(&c, addr, "/orders", &key, "x").await.unwrap();
    let first = first.await.unwrap();
    let n = db
        .count(&format!("SELECT count(*) FROM orders WHERE key = '{key}'"))
        .await;
    assert_eq!(
        (n, runs.load(Ordering::SeqCst)),
        (1, 1),
        "first: {first:?}, repeat while the first was still answering: {repeat:?}"
    );
}

/// A lease-mode handler: its effect is outside the request's transaction (there is none), so it
/// writes through the pool; it takes a while.
async fn lease_handler(
    pool: sqlx::PgPool,
    runs: Arc<AtomicU32>,
    req: Req,
) -> Result<Response<Full<Bytes>>, BoxError> {
    runs.fetch_add(1, Ordering::SeqCst);
    let key = req
        .extensions()
        .get::<RequestKey>()
        .unwrap()
        .as_str()
        .to_owned();
    sqlx::query("INSERT INTO orders (key, note) VALUES ($1, 'lease')")
        .bind(&key)
        .execute(&pool)
        .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(created("lease".into()))
}

/// An atomic-mode handler that writes in the transaction and takes a while.
async fn atomic_handler(runs: Arc<AtomicU32>, req: Req) -> Result<Response<Full<Bytes>>, BoxError> {
    runs.fetch_add(1, Ordering::SeqCst);
    let key = req
        .extensions()
        .get::<RequestKey>()
        .unwrap()
        .as_str()
        .to_owned();
    let tx = KeyTransaction::of(&req).unwrap().clone();
    let mut conn = tx.acquire().await?;
    sqlx::query("INSERT INTO orders (key, note) VALUES ($1, 'atomic')")
        .bind(&key)
        .execute(&mut *conn)
        .await?;
    drop(conn);
    tokio::time::sleep(Duration::from_millis(600)).await;
    // Drain the body so the request is complete.
    let _ = req.into_body().collect().await;
    Ok(created("atomic".into()))
}

// Both modes keep the same table (`SCHEMA` says so), but an atomic claim writes no row while it
// runs: a lease-mode server (one not yet switched over in a rolling deploy, or another route on
// the same store) finds the key free and runs the same request again, and the atomic commit
// then overwrites the lease claim's row unconditionally (its ON CONFLICT has no WHERE).
/// Found by the adversarial review of the PostgreSQL store (issue 21).
#[tokio::test]
async fn lease_mode_runs_a_key_that_atomic_mode_is_running() {
    let db = TestDb::new().await;
    let pool = db.pool(8).await;
    let store = PostgresStore::from_pool(pool.clone());
    store.migrate().await.unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let (r1, r2) = (runs.clone(), runs.clone());
    let atomic = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store.clone()).atomic())
        .service(service_fn(move |req| atomic_handler(r1.clone(), req)));
    let lease = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store))
        .service(service_fn(move |req| {
            lease_handler(pool.clone(), r2.clone(), req)
        }));
    let atomic_addr = serve(atomic).await;
    let lease_addr = serve(lease).await;
    let c = client();
    let key = fresh("k");
    let first = {
        let (c, key) = (c.clone(), key.clone());
        tokio::spawn(async move { post(&c, atomic_addr, "/orders", &key, "x").await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let repeat = post(&c, lease_addr, "/orders", &key, "x").await.unwrap();
    let first = first.await.unwrap();
    let n = db
        .count(&format!("SELECT count(*) FROM orders WHERE key = '{key}'"))
        .await;
    assert_eq!(
        (runs.load(Ordering::SeqCst), n),
        (1, 1),
        "atomic first: {first:?}; lease-mode repeat while it ran: {repeat:?}"
    );
}

/// Acquires the request's connection, then (through a helper, say) acquires it again.
async fn acquires_twice(runs: Arc<AtomicU32>, req: Req) -> Result<Response<Full<Bytes>>, BoxError> {
    runs.fetch_add(1, Ordering::SeqCst);
    let tx = KeyTransaction::of(&req).unwrap().clone();
    let _outer = tx.acquire().await?;
    let _inner = tx.acquire().await?;
    Ok(created("never".into()))
}

// A handler that acquires the guard twice waits on itself forever: the request never gets an
// answer, and since a claimed run is detached from its client, the key's lock and a pooled
// connection stay held for the life of the process — every later repeat of the key gets 409,
// forever. Expected: the second acquire fails (or the layer bounds the wait), freeing the key.
/// Found by the adversarial review of the PostgreSQL store (issue 21).
#[tokio::test]
async fn acquiring_the_guard_twice_holds_the_key_and_a_connection_forever() {
    let db = TestDb::new().await;
    let store = PostgresStore::from_pool(db.pool(4).await);
    store.migrate().await.unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let svc = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store.clone()).atomic())
        .service(service_fn(move |req| acquires_twice(r.clone(), req)));
    let addr = serve(svc).await;
    let c = client();
    let key = fresh("k");
    let first =
        tokio::time::timeout(Duration::from_secs(3), post(&c, addr, "/orders", &key, "x")).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The handler fails (its second acquire is refused), so hyper answers with no response:
    // what matters is that the repeat is not refused as in flight.
    let repeat = post(&c, addr, "/orders", &key, "x").await;
    let repeat_busy = matches!(repeat, Ok((409, ..)));
    // A connection goes back to the pool from a task of sqlx's: give it up to 2 s (held for
    // good is the defect).
    let mut held = u32::MAX;
    for _ in 0..40 {
        held = store.pool().size() - store.pool().num_idle() as u32;
        if held == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // End the stuck transaction (ours only: the sessions holding locks in this test's schema),
    // or dropping the schema would wait on it forever.
    let admin = db.pool(1).await;
    sqlx::query(
        "SELECT pg_terminate_backend(l.pid) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
         JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND l.pid <> pg_backend_pid()",
    )
    .bind(&db.schema)
    .execute(&admin)
    .await
    .unwrap();
    admin.close().await;
    assert!(
        first.is_ok() && !repeat_busy && held == 0,
        "first answered within 3 s: {}; repeat: {repeat:?}; connections still held: {held}",
        first.is_ok()
    );
}

/// A schema-per-tenant handler: the common `SET LOCAL search_path` to the tenant's schema (which
/// has its own tables, the crate's included: `migrate` applies to the first schema of the
/// `search_path`), then its write.
async fn tenant_schema_handler(
    tenant: String,
    runs: Arc<AtomicU32>,
    req: Req,
) -> Result<Response<Full<Bytes>>, BoxError> {
    runs.fetch_add(1, Ordering::SeqCst);
    let key = req
        .extensions()
        .get::<RequestKey>()
        .unwrap()
        .as_str()
        .to_owned();
    let tx = KeyTransaction::of(&req).unwrap().clone();
    let mut conn = tx.acquire().await?;
    sqlx::query(&format!("SET LOCAL search_path TO {tenant}"))
        .execute(&mut *conn)
        .await?;
    sqlx::query("INSERT INTO orders (key, note) VALUES ($1, 'tenant')")
        .bind(&key)
        .execute(&mut *conn)
        .await?;
    drop(conn);
    Ok(created("tenant order".into()))
}

// The claim checks the key in the table of the pool's search_path, but the entry is written by
// an unqualified INSERT in the handler's transaction, after the handler's statements: a handler
// that switched `search_path` (schema-per-tenant) gets the entry written into the other
// schema's table, so the next repeat finds no entry and runs the handler again (applied twice).
/// Found by the adversarial review of the PostgreSQL store (issue 21).
#[tokio::test]
async fn a_handler_that_sets_search_path_makes_the_entry_invisible_and_runs_twice() {
    let db = TestDb::new().await;
    let tenant = TestDb::new().await;
    // The tenant's schema holds the crate's table too (migrated through a pool in it).
    PostgresStore::from_pool(tenant.pool(1).await)
        .migrate()
        .await
        .unwrap();
    let store = PostgresStore::from_pool(db.pool(4).await);
    store.migrate().await.unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let (r, t) = (runs.clone(), tenant.schema.clone());
    let svc = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store).atomic())
        .service(service_fn(move |req| {
            tenant_schema_handler(t.clone(), r.clone(), req)
        }));
    let addr = serve(svc).await;
    let c = client();
    let key = fresh("k");
    let first = post(&c, addr, "/orders", &key, "x").await.unwrap();
    let again = post(&c, addr, "/orders", &key, "x").await.unwrap();
    let n = tenant
        .count(&format!("SELECT count(*) FROM orders WHERE key = '{key}'"))
        .await;
    assert_eq!(
        (runs.load(Ordering::SeqCst), n, again.1),
        (1, 1, true),
        "first: {first:?}; repeat: {again:?}"
    );
}

/// `PostgresStore::schema` names the table's schema whatever the pool's `search_path` says:
/// `migrate` creates it there, and both modes keep their entries there.
///
/// Found by the adversarial review of the PostgreSQL store (issue 21).
#[tokio::test]
async fn a_named_schema_holds_the_table_whatever_the_search_path() {
    let app = TestDb::new().await;
    let keys = TestDb::new().await;
    // The pool's search_path is the app's schema; the keys go to the other one.
    let store = PostgresStore::from_pool(app.pool(4).await).schema(&keys.schema);
    store.migrate().await.unwrap();
    let table = |schema: &str| {
        format!(
            "SELECT count(*) FROM information_schema.tables \
             WHERE table_schema = '{schema}' AND table_name = 'idempotency_keys'"
        )
    };
    assert_eq!(app.count(&table(&app.schema)).await, 0);
    assert_eq!(keys.count(&table(&keys.schema)).await, 1);
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let svc = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store).atomic())
        .service(service_fn(move |req| atomic_handler(r.clone(), req)));
    let addr = serve(svc).await;
    let c = client();
    let key = fresh("k");
    let first = post(&c, addr, "/orders", &key, "x").await.unwrap();
    let again = post(&c, addr, "/orders", &key, "x").await.unwrap();
    assert_eq!((first.0, again.0, again.1), (201, 201, true));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let stored = format!("SELECT count(*) FROM idempotency_keys WHERE key = '{key}'");
    assert_eq!(
        keys.count(&stored).await,
        1,
        "the entry is in the named schema"
    );
}

/// A pool whose connections set `search_path` in their session (`after_connect`) cannot say
/// where the store's table is: the store refuses to guess, and says to name the schema.
///
/// Found by the adversarial review of the PostgreSQL store (issue 21).
#[tokio::test]
async fn a_search_path_set_after_connect_needs_the_schema_named() {
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    use sqlx::Executor;
    use std::str::FromStr;
    let db = TestDb::new().await;
    let schema = db.schema.clone();
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .after_connect(move |conn, _| {
            let set = format!("SET search_path TO {schema}");
            Box::pin(async move { conn.execute(set.as_str()).await.map(drop) })
        })
        .connect_with(PgConnectOptions::from_str(&db.url).unwrap())
        .await
        .unwrap();
    let refused = PostgresStore::from_pool(pool.clone()).migrate().await;
    let err = refused.expect_err("the store guesses no schema");
    let why = std::error::Error::source(&err).map(ToString::to_string);
    assert!(
        why.as_deref()
            .is_some_and(|w| w.contains("PostgresStore::schema")),
        "{err}: {why:?}"
    );
    PostgresStore::from_pool(pool.clone())
        .schema(&db.schema)
        .migrate()
        .await
        .unwrap();
    pool.close().await;
    assert_eq!(
        db.count("SELECT count(*) FROM idempotency_keys").await,
        0,
        "the table is in the named schema"
    );
}
