//! Adversarial review, round 2, of two fixes: lease renewal from the handler's own task
//! (08a8b2f) and the PostgreSQL store's atomic/lease modes (ac4e316). Real sockets on
//! 127.0.0.1, handlers that count their side effects, exact counts. Six defects it found are
//! fixed and their tests run; two tests marked `#[ignore = "known limit, …"]` fail by design of
//! tokio's current-thread scheduler, a limit the server docs state (run them with
//! `--ignored`); the others are attacks that held (kept as regression tests).
#![cfg(all(feature = "postgres", feature = "redis"))]

mod pg;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::{Frame, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use pg::{client, fresh, post, serve, TestDb};
use tower::{service_fn, BoxError, Layer, ServiceBuilder};
use tower_retry_safety::server::{
    IdempotencyLayer, IdempotencyStore, KeyTransaction, MemoryStore, PostgresStore, RedisStore,
    RequestKey,
};

/// The renewal tests time real work against a real clock: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

// ---------------------------------------------------------------------------------------------
// PostgreSQL, atomic mode
// ---------------------------------------------------------------------------------------------

type Req = Request<Either<Full<Bytes>, Incoming>>;

fn key_of(req: &Req) -> String {
    req.extensions()
        .get::<RequestKey>()
        .unwrap()
        .as_str()
        .to_owned()
}

/// Writes the order in the request's transaction, then `COMMIT`s by hand (the misuse the
/// layer promises to catch: "answers 500, keeps a record that says the outcome is unknown").
async fn write_and_commit_by_hand(req: &Req) -> Result<(), BoxError> {
    let key = key_of(req);
    let tx = KeyTransaction::of(req).unwrap().clone();
    let mut conn = tx.acquire().await?;
    sqlx::query("INSERT INTO orders (key, note) VALUES ($1, 'x')")
        .bind(&key)
        .execute(&mut *conn)
        .await?;
    sqlx::query("COMMIT").execute(&mut *conn).await?;
    Ok(())
}

async fn in_flight_rows(db: &TestDb, key: &str) -> i64 {
    db.count(&format!(
        "SELECT count(*) FROM idempotency_keys WHERE key = '{key}' AND NOT completed"
    ))
    .await
}

// DEFECT. A handler that COMMITs by hand and then returns an error: `Run::call`'s error path
// rolls back (nothing to roll back any more) and returns the error without looking at whether
// the transaction was still the one that took the key. The hand-made COMMIT committed the
// claim's in-flight row (expires_at = now + TTL, 24 h by default), so the key answers 409 for
// the whole TTL and its outcome ("unknown") is never recorded — the order IS committed. The
// docs promise a hand-made COMMIT "answers 500, keeps a record that says the outcome is
// unknown (every repeat gets it)". Seen: runs 1, orders 1, repeat 409 (and again 409 for the
// TTL), one in-flight row left; expected: the repeat gets the stored 500 (unknown), no in-flight
// row.
//
// Proposed fix: on every path that does not commit (the handler's error, a declined 5xx, an
// aborted transaction, a panic unwinding through `Run::call`), before rolling back ask the
// transaction whether it is still the request's: `SELECT current_setting('<LOCKED>', true)`
// in it (one round trip, error paths only; or fold it into the ROLLBACK as a
// multi-statement). If the setting is gone the handler ended it by hand: go to
// `handler_kept_the_transaction(Some(tx))` instead of `roll_back(tx)`. For the panic path,
// `Run` needs a drop guard that spawns the same check.
#[tokio::test]
async fn commit_by_hand_then_error_holds_the_key_for_the_ttl() {
    let db = TestDb::new().await;
    let store = PostgresStore::from_pool(db.pool(8).await);
    store.migrate().await.unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let svc = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store).atomic())
        .service(service_fn(move |req: Req| {
            let r = r.clone();
            async move {
                r.fetch_add(1, Ordering::SeqCst);
                write_and_commit_by_hand(&req).await?;
                Err::<Response<Full<Bytes>>, BoxError>("the handler failed after its COMMIT".into())
            }
        }));
    let addr = serve(svc).await;
    let c = client();
    let key = fresh("k");
    // The handler's error is not passed on: its transaction was ended by hand, so the first
    // request gets what every repeat gets, the unknown outcome.
    let first = post(&c, addr, "/orders", &key, "x").await.unwrap();
    assert_eq!(first.0, 500, "{first:?}");
    let repeat = post(&c, addr, "/orders", &key, "x").await.unwrap();
    let n = db
        .count(&format!("SELECT count(*) FROM orders WHERE key = '{key}'"))
        .await;
    let stuck = in_flight_rows(&db, &key).await;
    assert_eq!((n, runs.load(Ordering::SeqCst)), (1, 1));
    assert_eq!(
        (repeat.0, stuck),
        (500, 0),
        "the order committed; the repeat should get the unknown outcome, not 409 for 24 h: {repeat:?}"
    );
}

// DEFECT. Same hole on the `store_server_errors(false)` path: a handler that COMMITs by hand
// and answers 503. The 5xx check runs before the record is written (the write is what notices
// a hand-ended transaction, through the LOCKED setting), so the layer rolls back (nothing) and
// passes the 503 through, which under `store_server_errors(false)` tells the client that
// nothing was applied — yet the order committed. The in-flight row committed with the hand-made
// COMMIT holds the key for the TTL: every repeat gets 409 for 24 h; the outcome is never
// recorded. Seen: runs 1, orders 1, first 503, repeat 409, one in-flight row.
//
// Proposed fix: as above — check `current_setting('<LOCKED>', true)` in the transaction before
// the declined-5xx rollback, and treat a gone setting as `handler_kept_the_transaction`.
#[tokio::test]
async fn commit_by_hand_then_declined_5xx_holds_the_key_for_the_ttl() {
    let db = TestDb::new().await;
    let store = PostgresStore::from_pool(db.pool(8).await);
    store.migrate().await.unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let svc = ServiceBuilder::new()
        .layer(
            IdempotencyLayer::new(store)
                .store_server_errors(false)
                .atomic(),
        )
        .service(service_fn(move |req: Req| {
            let r = r.clone();
            async move {
                r.fetch_add(1, Ordering::SeqCst);
                write_and_commit_by_hand(&req).await?;
                let mut res = Response::new(Full::new(Bytes::from_static(b"busy")));
                *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                Ok::<_, BoxError>(res)
            }
        }));
    let addr = serve(svc).await;
    let c = client();
    let key = fresh("k");
    let first = post(&c, addr, "/orders", &key, "x").await.unwrap();
    let repeat = post(&c, addr, "/orders", &key, "x").await.unwrap();
    let n = db
        .count(&format!("SELECT count(*) FROM orders WHERE key = '{key}'"))
        .await;
    let stuck = in_flight_rows(&db, &key).await;
    assert_eq!((n, runs.load(Ordering::SeqCst)), (1, 1));
    assert_eq!(
        (first.0, repeat.0, stuck),
        (500, 500, 0),
        "the order committed: the first answer should not be a declined 5xx (nothing applied), nor the repeat 409 for 24 h: first {first:?}, repeat {repeat:?}"
    );
}

/// Ends the request's transaction by hand with `ROLLBACK`, then writes the order outside any
/// transaction (autocommit on the same connection): the misuse the docs say the layer "cannot
/// see until the handler answers".
async fn roll_back_by_hand_then_write(req: &Req) -> Result<(), BoxError> {
    let key = key_of(req);
    let tx = KeyTransaction::of(req).unwrap().clone();
    let mut conn = tx.acquire().await?;
    sqlx::query("ROLLBACK").execute(&mut *conn).await?;
    sqlx::query("INSERT INTO orders (key, note) VALUES ($1, 'x')")
        .bind(&key)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

// DEFECT (the strong form of the two above: a write applied twice). A handler that ROLLBACKs by
// hand, writes in autocommit, then returns an error. The docs: this misuse cannot be seen
// "until the handler answers" — but on the error path it is never seen: `Run::call` rolls back
// and returns the error; the key's lock and in-flight row went with the hand-made ROLLBACK, so
// the key is free and nothing records the autocommitted write. The client's repeat (a service
// error is a dropped connection: the retry layer repeats it with the same key) runs the
// handler again. Seen: runs 2, orders 2 (1 expected, the repeat answered with the stored
// unknown outcome, 500).
//
// Proposed fix: the same check as for a hand-made COMMIT — on the error path (and the declined
// 5xx, aborted and panic paths), read `current_setting('<LOCKED>', true)` in the transaction
// before rolling back; gone means the handler ended it: `handler_kept_the_transaction(Some(tx))`
// (which writes the unknown outcome) instead of `roll_back(tx)`.
#[tokio::test]
async fn roll_back_by_hand_write_then_error_runs_twice() {
    let db = TestDb::new().await;
    let store = PostgresStore::from_pool(db.pool(8).await);
    store.migrate().await.unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let svc = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store).atomic())
        .service(service_fn(move |req: Req| {
            let r = r.clone();
            async move {
                r.fetch_add(1, Ordering::SeqCst);
                roll_back_by_hand_then_write(&req).await?;
                Err::<Response<Full<Bytes>>, BoxError>("failed after its own ROLLBACK".into())
            }
        }));
    let addr = serve(svc).await;
    let c = client();
    let key = fresh("k");
    // Caught: the first request gets the unknown outcome rather than the handler's error.
    let first = post(&c, addr, "/orders", &key, "x").await.unwrap();
    assert_eq!(first.0, 500, "{first:?}");
    let repeat = post(&c, addr, "/orders", &key, "x").await;
    let n = db
        .count(&format!("SELECT count(*) FROM orders WHERE key = '{key}'"))
        .await;
    assert_eq!(
        (n, runs.load(Ordering::SeqCst)),
        (1, 1),
        "the repeat ran the handler again: {repeat:?}"
    );
}

// HELD. Hand ROLLBACK + autocommit write + 201: caught when it answers (500, unknown kept), one
// run.
#[tokio::test]
async fn roll_back_by_hand_write_then_success_is_recorded_unknown() {
    let db = TestDb::new().await;
    let store = PostgresStore::from_pool(db.pool(8).await);
    store.migrate().await.unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let svc = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store).atomic())
        .service(service_fn(move |req: Req| {
            let r = r.clone();
            async move {
                r.fetch_add(1, Ordering::SeqCst);
                roll_back_by_hand_then_write(&req).await?;
                Ok::<_, BoxError>(Response::new(Full::new(Bytes::from_static(b"ok"))))
            }
        }));
    let addr = serve(svc).await;
    let c = client();
    let key = fresh("k");
    let first = post(&c, addr, "/orders", &key, "x").await.unwrap();
    let repeat = post(&c, addr, "/orders", &key, "x").await.unwrap();
    let n = db
        .count(&format!("SELECT count(*) FROM orders WHERE key = '{key}'"))
        .await;
    assert_eq!((n, runs.load(Ordering::SeqCst)), (1, 1));
    assert_eq!((first.0, repeat.0), (500, 500), "{first:?} {repeat:?}");
}

/// A handler whose spawned task takes the transaction, writes, and holds it for 3 s (past the
/// layer's 2 s `HOLDER_WAIT`); the handler answers 201 as soon as the task holds it.
async fn spawned_holder(runs: Arc<AtomicU32>, req: Req) -> Result<Response<Full<Bytes>>, BoxError> {
    runs.fetch_add(1, Ordering::SeqCst);
    let key = key_of(&req);
    let tx = KeyTransaction::of(&req).unwrap().clone();
    let (held_tx, held_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let Ok(mut conn) = tx.acquire().await else {
            return;
        };
        let _ = held_tx.send(());
        let _ = sqlx::query("INSERT INTO orders (key, note) VALUES ($1, 'spawned')")
            .bind(&key)
            .execute(&mut *conn)
            .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
    });
    let _ = held_rx.await;
    Ok(Response::new(Full::new(Bytes::from_static(b"created"))))
}

// HELD. The HOLDER_WAIT path: a spawned task holds the guard 3 s. The first answer (at ~2 s) is
// 500; a repeat while the task still holds it gets 409 (the open transaction holds the lock);
// once it lets go the unknown outcome is written (the task's insert rolled back): repeats get
// the 500. One run, no order kept.
#[tokio::test]
async fn a_spawned_task_holding_the_transaction_past_holder_wait() {
    let db = TestDb::new().await;
    let store = PostgresStore::from_pool(db.pool(8).await);
    store.migrate().await.unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let svc = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store).atomic())
        .service(service_fn(move |req| spawned_holder(r.clone(), req)));
    let addr = serve(svc).await;
    let c = client();
    let key = fresh("k");
    let started = std::time::Instant::now();
    let first = post(&c, addr, "/orders", &key, "x").await.unwrap();
    let answered = started.elapsed();
    let during = post(&c, addr, "/orders", &key, "x").await.unwrap();
    tokio::time::sleep(Duration::from_millis(3500).saturating_sub(started.elapsed())).await;
    // The waiter's rollback and record take a moment after the holder lets go.
    let mut after = post(&c, addr, "/orders", &key, "x").await.unwrap();
    for _ in 0..20 {
        if after.0 != 409 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = post(&c, addr, "/orders", &key, "x").await.unwrap();
    }
    let n = db
        .count(&format!("SELECT count(*) FROM orders WHERE key = '{key}'"))
        .await;
    assert_eq!((n, runs.load(Ordering::SeqCst)), (0, 1));
    assert!(answered >= Duration::from_millis(1900), "{answered:?}");
    assert_eq!(
        (first.0, during.0, after.0),
        (500, 409, 500),
        "{first:?} {during:?} {after:?}"
    );
}

/// Start and end of each run of a key.
type Runs = Arc<Mutex<Vec<(String, Instant, Instant)>>>;

async fn timed_atomic(log: Runs, req: Req) -> Result<Response<Full<Bytes>>, BoxError> {
    let start = Instant::now();
    let key = key_of(&req);
    {
        let tx = KeyTransaction::of(&req).unwrap().clone();
        let mut conn = tx.acquire().await?;
        sqlx::query("INSERT INTO orders (key, note) VALUES ($1, 'atomic')")
            .bind(&key)
            .execute(&mut *conn)
            .await?;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    log.lock().unwrap().push((key, start, Instant::now()));
    Ok(Response::new(Full::new(Bytes::from_static(b"atomic"))))
}

async fn timed_lease(
    pool: sqlx::PgPool,
    log: Runs,
    req: Req,
) -> Result<Response<Full<Bytes>>, BoxError> {
    let start = Instant::now();
    let key = key_of(&req);
    sqlx::query("INSERT INTO orders (key, note) VALUES ($1, 'lease')")
        .bind(&key)
        .execute(&pool)
        .await?;
    tokio::time::sleep(Duration::from_millis(20)).await;
    log.lock().unwrap().push((key, start, Instant::now()));
    Ok(Response::new(Full::new(Bytes::from_static(b"lease"))))
}

// HELD. Records that expire while claims and sweeps race: TTL 150 ms, 4 keys hammered for 1.5 s
// by 8 clients each through an atomic-mode and a lease-mode server (two pools), with
// `purge_expired` looping. A key may run again once its record expired, but two runs of one
// key never overlap, and a run never starts less than the TTL after the previous one ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiring_records_racing_claims_and_sweeps() {
    let ttl = Duration::from_millis(150);
    let db = TestDb::new().await;
    let atomic_store = PostgresStore::from_pool(db.pool(10).await);
    atomic_store.migrate().await.unwrap();
    let lease_pool = db.pool(10).await;
    let lease_store = PostgresStore::from_pool(lease_pool.clone());
    let sweeper = PostgresStore::from_pool(db.pool(2).await);
    let log: Runs = Arc::new(Mutex::new(Vec::new()));
    let (la, ll) = (log.clone(), log.clone());
    let atomic = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(atomic_store).ttl(ttl).atomic())
        .service(service_fn(move |req| timed_atomic(la.clone(), req)));
    let lease = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(lease_store).ttl(ttl))
        .service(service_fn(move |req| {
            timed_lease(lease_pool.clone(), ll.clone(), req)
        }));
    let (a, l) = (serve(atomic).await, serve(lease).await);
    let keys: Vec<String> = (0..4).map(|i| fresh(&format!("exp{i}"))).collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sweeping = {
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let _ = sweeper.purge_expired(1000).await;
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        })
    };
    let c = client();
    let mut tasks = Vec::new();
    for i in 0..8 {
        for key in &keys {
            let (c, key, stop) = (c.clone(), key.clone(), stop.clone());
            let addr = if i % 2 == 0 { a } else { l };
            tasks.push(tokio::spawn(async move {
                let mut statuses = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((s, _, _)) = post(&c, addr, "/orders", &key, "x").await {
                        statuses.push(s);
                    }
                }
                statuses
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut statuses = std::collections::BTreeMap::new();
    for t in tasks {
        for s in t.await.unwrap() {
            *statuses.entry(s).or_insert(0u32) += 1;
        }
    }
    sweeping.await.unwrap();
    let mut log = log.lock().unwrap().clone();
    log.sort_by_key(|(k, s, _)| (k.clone(), *s));
    let n = db.count("SELECT count(*) FROM orders").await;
    assert_eq!(n as usize, log.len(), "statuses {statuses:?}");
    for w in log.windows(2) {
        let ((k1, _, end1), (k2, start2, _)) = (&w[0], &w[1]);
        if k1 != k2 {
            continue;
        }
        // Small slack: the record's expiry is from its commit (after `end1`), and the two
        // clocks (PostgreSQL's and ours) are read at different moments.
        assert!(
            *start2 >= *end1 + ttl - Duration::from_millis(30),
            "{k1}: a run started {:?} after the previous ended (TTL {ttl:?}); statuses {statuses:?}",
            start2.saturating_duration_since(*end1)
        );
    }
    eprintln!("runs {} statuses {statuses:?}", log.len());
    assert!(
        log.len() >= keys.len() * 2,
        "too few runs to mean anything: {}",
        log.len()
    );
}

/// A POST with a key and a client header.
async fn post_as(
    c: &hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        Full<Bytes>,
    >,
    addr: SocketAddr,
    client_id: Option<&str>,
    key: &str,
) -> (u16, bool) {
    let mut req = Request::post(format!("http://{addr}/orders"))
        .header("idempotency-key", format!("\"{key}\""));
    if let Some(id) = client_id {
        req = req.header("x-client", id);
    }
    let res = c
        .request(req.body(Full::new(Bytes::from_static(b"x"))).unwrap())
        .await
        .unwrap();
    let out = (
        res.status().as_u16(),
        res.headers().contains_key("idempotent-replayed"),
    );
    let _ = res.into_body().collect().await;
    out
}

// HELD. Scoped keys across modes: an atomic-mode and a lease-mode server over one table, both
// scoping by `x-client`. Client A's key runs once whichever server it reaches (the lease server
// sees the atomic record and replays it); client B's same key is its own (one more run); a
// keyed request without the header is refused, nothing runs; a response over
// max_response_bytes (64 bytes here) is kept as its head and replayed as such, still once.
#[tokio::test]
async fn scoped_keys_across_modes_and_an_oversized_response() {
    let db = TestDb::new().await;
    let atomic_store = PostgresStore::from_pool(db.pool(6).await);
    atomic_store.migrate().await.unwrap();
    let lease_pool = db.pool(6).await;
    let lease_store = PostgresStore::from_pool(lease_pool.clone());
    let runs = Arc::new(AtomicU32::new(0));
    let (ra, rl) = (runs.clone(), runs.clone());
    let header = http::HeaderName::from_static("x-client");
    let atomic = ServiceBuilder::new()
        .layer(
            IdempotencyLayer::new(atomic_store)
                .scope_keys_by_header(header.clone())
                .max_response_bytes(64)
                .atomic(),
        )
        .service(service_fn(move |req| big_atomic(ra.clone(), req)));
    let lease = ServiceBuilder::new()
        .layer(
            IdempotencyLayer::new(lease_store)
                .scope_keys_by_header(header)
                .max_response_bytes(64),
        )
        .service(service_fn(move |req| {
            lease_write(lease_pool.clone(), rl.clone(), req, 10)
        }));
    let (a, l) = (serve(atomic).await, serve(lease).await);
    let c = client();
    let key = fresh("scoped");
    let a1 = post_as(&c, a, Some("alice"), &key).await;
    let a2 = post_as(&c, l, Some("alice"), &key).await;
    let a3 = post_as(&c, a, Some("alice"), &key).await;
    let b1 = post_as(&c, l, Some("bob"), &key).await;
    let b2 = post_as(&c, a, Some("bob"), &key).await;
    let none = post_as(&c, a, None, &key).await;
    let n = db.count("SELECT count(*) FROM orders").await;
    assert_eq!(
        (n, runs.load(Ordering::SeqCst)),
        (2, 2),
        "{a1:?} {a2:?} {a3:?} {b1:?} {b2:?} {none:?}"
    );
    assert_eq!(
        (a1, a2, a3, b1, b2, none.0),
        (
            (201, false),
            (201, true),
            (201, true),
            (200, false),
            (200, true),
            400
        )
    );
}

/// An atomic handler answering 201 with a 1 KiB body.
async fn big_atomic(runs: Arc<AtomicU32>, req: Req) -> Result<Response<Full<Bytes>>, BoxError> {
    runs.fetch_add(1, Ordering::SeqCst);
    let key = key_of(&req);
    {
        let tx = KeyTransaction::of(&req).unwrap().clone();
        let mut conn = tx.acquire().await?;
        sqlx::query("INSERT INTO orders (key, note) VALUES ($1, 'big')")
            .bind(&key)
            .execute(&mut *conn)
            .await?;
    }
    let mut res = Response::new(Full::new(Bytes::from(vec![b'x'; 1024])));
    *res.status_mut() = StatusCode::CREATED;
    Ok(res)
}

// DEFECT (same root cause). A handler that COMMITs by hand and then panics: the panic unwinds
// through `Run::call`, the transaction is dropped (a rollback of nothing), and no unknown
// outcome is written: the committed in-flight row holds the key for the TTL (409 for 24 h),
// the order committed. Seen: runs 1, orders 1, repeat 409, one in-flight row.
//
// Proposed fix: a drop guard in `Run::call` (armed while the handler runs) that, on unwind,
// spawns the LOCKED check on the transaction and `settle_unknown` when it is gone.
#[tokio::test]
async fn commit_by_hand_then_panic_holds_the_key_for_the_ttl() {
    let db = TestDb::new().await;
    let store = PostgresStore::from_pool(db.pool(8).await);
    store.migrate().await.unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let svc = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store).atomic())
        .service(service_fn(move |req: Req| {
            let r = r.clone();
            async move {
                r.fetch_add(1, Ordering::SeqCst);
                write_and_commit_by_hand(&req).await?;
                if r.load(Ordering::SeqCst) > 0 {
                    panic!("the handler panicked after its COMMIT");
                }
                Ok::<_, BoxError>(Response::new(Full::new(Bytes::from_static(b"ok"))))
            }
        }));
    let addr = serve(svc).await;
    let c = client();
    let key = fresh("k");
    let first = post(&c, addr, "/orders", &key, "x").await;
    assert!(first.is_err(), "{first:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let repeat = post(&c, addr, "/orders", &key, "x").await.unwrap();
    let n = db
        .count(&format!("SELECT count(*) FROM orders WHERE key = '{key}'"))
        .await;
    let stuck = in_flight_rows(&db, &key).await;
    assert_eq!((n, runs.load(Ordering::SeqCst)), (1, 1));
    assert_eq!(
        (repeat.0, stuck),
        (500, 0),
        "the order committed; the repeat should get the unknown outcome, not 409 for 24 h: {repeat:?}"
    );
}

// HELD. Hand COMMIT + 201: recorded as unknown (500), repeats get the 500, one run.
#[tokio::test]
async fn commit_by_hand_then_success_is_recorded_unknown() {
    let db = TestDb::new().await;
    let store = PostgresStore::from_pool(db.pool(8).await);
    store.migrate().await.unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let svc = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store).atomic())
        .service(service_fn(move |req: Req| {
            let r = r.clone();
            async move {
                r.fetch_add(1, Ordering::SeqCst);
                write_and_commit_by_hand(&req).await?;
                Ok::<_, BoxError>(Response::new(Full::new(Bytes::from_static(b"ok"))))
            }
        }));
    let addr = serve(svc).await;
    let c = client();
    let key = fresh("k");
    let first = post(&c, addr, "/orders", &key, "x").await.unwrap();
    let repeat = post(&c, addr, "/orders", &key, "x").await.unwrap();
    let n = db
        .count(&format!("SELECT count(*) FROM orders WHERE key = '{key}'"))
        .await;
    assert_eq!((n, runs.load(Ordering::SeqCst)), (1, 1));
    assert_eq!((first.0, repeat.0), (500, 500), "{first:?} {repeat:?}");
}

/// A handler that writes in the transaction and takes `ms`.
async fn atomic_write(
    runs: Arc<AtomicU32>,
    req: Req,
    ms: u64,
) -> Result<Response<Full<Bytes>>, BoxError> {
    runs.fetch_add(1, Ordering::SeqCst);
    let key = key_of(&req);
    {
        let tx = KeyTransaction::of(&req).unwrap().clone();
        let mut conn = tx.acquire().await?;
        sqlx::query("INSERT INTO orders (key, note) VALUES ($1, 'atomic')")
            .bind(&key)
            .execute(&mut *conn)
            .await?;
    }
    tokio::time::sleep(Duration::from_millis(ms)).await;
    Ok(Response::new(Full::new(Bytes::from_static(b"atomic"))))
}

/// A lease-mode handler: writes through the pool, takes `ms`.
async fn lease_write(
    pool: sqlx::PgPool,
    runs: Arc<AtomicU32>,
    req: Req,
    ms: u64,
) -> Result<Response<Full<Bytes>>, BoxError> {
    runs.fetch_add(1, Ordering::SeqCst);
    let key = key_of(&req);
    sqlx::query("INSERT INTO orders (key, note) VALUES ($1, 'lease')")
        .bind(&key)
        .execute(&pool)
        .await?;
    tokio::time::sleep(Duration::from_millis(ms)).await;
    Ok(Response::new(Full::new(Bytes::from_static(b"lease"))))
}

// HELD. Lease mode and atomic mode on one table from two pools (two "servers"), 40 concurrent
// requests per key on 8 keys, alternating servers, a sweep of expired rows racing them: each
// key's write applied exactly once and every answer is 200 or 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_and_atomic_servers_race_on_the_same_keys() {
    let db = TestDb::new().await;
    let atomic_store = PostgresStore::from_pool(db.pool(12).await);
    atomic_store.migrate().await.unwrap();
    let lease_pool = db.pool(12).await;
    let lease_store = PostgresStore::from_pool(lease_pool.clone());
    let sweeper = lease_store.clone();
    let runs = Arc::new(AtomicU32::new(0));
    let (ra, rl) = (runs.clone(), runs.clone());
    let atomic = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(atomic_store).atomic())
        .service(service_fn(move |req| atomic_write(ra.clone(), req, 30)));
    let lease = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(lease_store))
        .service(service_fn(move |req| {
            lease_write(lease_pool.clone(), rl.clone(), req, 30)
        }));
    let (a, l) = (serve(atomic).await, serve(lease).await);
    let keys: Vec<String> = (0..8).map(|i| fresh(&format!("race{i}"))).collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sweeping = {
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let _ = sweeper.purge_expired(1000).await;
                tokio::task::yield_now().await;
            }
        })
    };
    let c = client();
    let mut tasks = Vec::new();
    for i in 0..40 {
        for key in &keys {
            let (c, key) = (c.clone(), key.clone());
            let addr = if i % 2 == 0 { a } else { l };
            tasks.push(tokio::spawn(async move {
                post(&c, addr, "/orders", &key, "x").await
            }));
        }
    }
    let mut statuses = std::collections::BTreeMap::new();
    for t in tasks {
        let s = match t.await.unwrap() {
            Ok((s, _, _)) => s,
            Err(_) => 0,
        };
        *statuses.entry(s).or_insert(0u32) += 1;
    }
    stop.store(true, Ordering::Relaxed);
    sweeping.await.unwrap();
    let n = db.count("SELECT count(*) FROM orders").await;
    assert_eq!(
        (n, runs.load(Ordering::SeqCst)),
        (8, 8),
        "statuses: {statuses:?}"
    );
    assert!(
        statuses.keys().all(|s| *s == 200 || *s == 409),
        "statuses: {statuses:?}"
    );
}

// HELD. A handler sets search_path at session level (not LOCAL) to a schema with its own
// `idempotency_keys` table; the pooled connection (pool of 1) is reused by the next requests:
// records still go to the store's schema, one run.
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
    assert!(second.1 && third.1, "replays: {second:?} {third:?}");
}

// DEFECT. Two stores over one pool (the application's pool, handed to `from_pool` twice: one
// router per service, a lease-mode and an atomic-mode layer built separately, or a store made
// lazily). The second store reads its schema with `SELECT current_schema()` on whatever pooled
// connection it gets, at its first request — a connection that an atomic-mode handler of the
// first store left with a session-level `search_path` (a tenant's schema with its own copy of
// the table, e.g. from a per-tenant migration). The second store then keeps its records in the
// tenant's table: the two stores no longer see each other's keys, and a key the first store
// completed runs again through the second. Seen: orders 2, runs 2.
//
// Proposed fix: never take the schema from a pooled connection's live state. Read it from the
// pool's connect options (`search_path` option, else the server default for a fresh session)
// or on a fresh connection (`pool.connect_options()` + `PgConnection::connect_with`) that no
// handler has touched; or require `PostgresStore::schema` when the pool is shared.
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
        "first {first:?}, same key through the second store {second:?}; records in the tenant's table: {in_tenant}"
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

// ---------------------------------------------------------------------------------------------
// Lease renewal
// ---------------------------------------------------------------------------------------------

/// What a renewal test's handler does.
#[derive(Clone, Copy, Debug)]
enum Work {
    /// Works `stretches` stretches of `stretch` without yielding, yielding between them.
    Busy { stretch: Duration, stretches: u32 },
    /// Waits on a timer (I/O) for `for_`: never polled meanwhile.
    Pending { for_: Duration },
    /// Answers at once with a body of `chunks` chunks, each after `stretch` of work without
    /// yielding and then a timer of `gap`.
    SlowBody {
        chunks: u32,
        stretch: Duration,
        gap: Duration,
    },
}

/// A response body that works (without yielding) and waits before each chunk.
struct SlowBody {
    left: u32,
    stretch: Duration,
    gap: Duration,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl SlowBody {
    fn full() -> SlowBody {
        SlowBody {
            left: 1,
            stretch: Duration::ZERO,
            gap: Duration::ZERO,
            sleep: None,
        }
    }
}

impl http_body::Body for SlowBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        use std::task::Poll;
        if let Some(s) = self.sleep.as_mut() {
            if s.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.sleep = None;
            self.left -= 1;
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"chunk")))));
        }
        if self.left == 0 {
            return Poll::Ready(None);
        }
        std::thread::sleep(self.stretch);
        if self.gap.is_zero() {
            self.left -= 1;
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"chunk")))));
        }
        let mut sleep = Box::pin(tokio::time::sleep(self.gap));
        if sleep.as_mut().poll(cx).is_pending() {
            self.sleep = Some(sleep);
            return Poll::Pending;
        }
        self.left -= 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"chunk")))))
    }
}

#[derive(Clone, Copy, Debug)]
enum Flavour {
    CurrentThread,
    /// Current-thread, its drivers polled every 4 task polls rather than 61.
    CurrentThreadEventInterval4,
    MultiThread,
}

struct Server {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Serves a handler doing `work` (counting its runs in the returned counter) behind an
/// `IdempotencyLayer` (lease `lease`) over the store `make_store` makes, from a runtime of
/// `flavour` on a thread of its own; `busy` other tasks there work `stretch` between yields
/// until the server stops.
fn serve_rt<St, F, Fut>(
    flavour: Flavour,
    lease: Duration,
    make_store: F,
    work: Work,
    busy: (usize, Duration),
) -> (SocketAddr, Arc<AtomicUsize>, Server)
where
    St: IdempotencyStore,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = St>,
{
    let applied = Arc::new(AtomicUsize::new(0));
    let counter = applied.clone();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let runtime = match flavour {
            Flavour::CurrentThread => tokio::runtime::Builder::new_current_thread(),
            Flavour::CurrentThreadEventInterval4 => {
                let mut b = tokio::runtime::Builder::new_current_thread();
                b.event_interval(4);
                b
            }
            Flavour::MultiThread => {
                let mut b = tokio::runtime::Builder::new_multi_thread();
                b.worker_threads(2);
                b
            }
        }
        .enable_all()
        .build()
        .unwrap();
        runtime.block_on(async move {
            let layer = IdempotencyLayer::new(make_store().await).lease(lease);
            let svc = layer.layer(service_fn(move |_req: Request<_>| {
                let counter = counter.clone();
                async move {
                    counter.fetch_add(1, Ordering::SeqCst);
                    let body = match work {
                        Work::Busy { stretch, stretches } => {
                            for _ in 0..stretches {
                                std::thread::sleep(stretch);
                                tokio::task::yield_now().await;
                            }
                            SlowBody::full()
                        }
                        Work::Pending { for_ } => {
                            tokio::time::sleep(for_).await;
                            SlowBody::full()
                        }
                        Work::SlowBody {
                            chunks,
                            stretch,
                            gap,
                        } => SlowBody {
                            left: chunks,
                            stretch,
                            gap,
                            sleep: None,
                        },
                    };
                    Ok::<_, Infallible>(Response::new(body))
                }
            }));
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            if busy.0 == usize::MAX {
                // Two tasks that hand a token back and forth, each working `busy.1` before it
                // passes it on: each wakes the other at once (no `yield_now`), so the run queue
                // is never empty.
                let (ab_tx, mut ab_rx) = tokio::sync::mpsc::channel::<()>(1);
                let (ba_tx, mut ba_rx) = tokio::sync::mpsc::channel::<()>(1);
                let (sa, sb, stretch) = (stop.clone(), stop.clone(), busy.1);
                drop(tokio::spawn(async move {
                    while !sa.load(Ordering::Relaxed) {
                        std::thread::sleep(stretch);
                        if ab_tx.send(()).await.is_err() || ba_rx.recv().await.is_none() {
                            return;
                        }
                    }
                }));
                drop(tokio::spawn(async move {
                    while !sb.load(Ordering::Relaxed) {
                        if ab_rx.recv().await.is_none() {
                            return;
                        }
                        std::thread::sleep(stretch);
                        if ba_tx.send(()).await.is_err() {
                            return;
                        }
                    }
                }));
            }
            for _ in 0..if busy.0 == usize::MAX { 0 } else { busy.0 } {
                let (s, stretch) = (stop.clone(), busy.1);
                drop(tokio::spawn(async move {
                    while !s.load(Ordering::Relaxed) {
                        std::thread::sleep(stretch);
                        tokio::task::yield_now().await;
                    }
                }));
            }
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let accept = async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        return;
                    };
                    let svc = svc.clone();
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                            tower::ServiceExt::oneshot(svc.clone(), req)
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
            };
            tokio::select! {
                _ = accept => {}
                _ = stop_rx => {}
            }
            stop.store(true, Ordering::Relaxed);
        });
    });
    (
        addr,
        applied,
        Server {
            stop: Some(stop_tx),
            thread: Some(thread),
        },
    )
}

async fn send(addr: SocketAddr, key: &str) -> (StatusCode, bool) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = Request::post(format!("http://{addr}/v1/send"))
        .header("idempotency-key", format!("\"{key}\""))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let res = client.request(req).await.expect("a response");
    let status = res.status();
    let replayed = res.headers().contains_key("idempotent-replayed");
    let _ = res.into_body().collect().await;
    (status, replayed)
}

/// A client that goes away 50 ms after sending: the call is detached onto the runtime.
async fn send_and_disconnect(addr: SocketAddr, key: &str) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = Request::post(format!("http://{addr}/v1/send"))
        .header("idempotency-key", format!("\"{key}\""))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let _ = tokio::time::timeout(Duration::from_millis(50), client.request(req)).await;
}

const LEASE: Duration = Duration::from_millis(400);

async fn memory() -> MemoryStore {
    MemoryStore::new()
}

/// Deletes every key under its prefix when dropped (the test's end, passed or failed): a run
/// leaves nothing behind.
struct Clean(String);

impl Drop for Clean {
    fn drop(&mut self) {
        let url =
            std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
        let Ok(mut conn) = redis::Client::open(url).and_then(|c| c.get_connection()) else {
            return;
        };
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", self.0))
            .query(&mut conn)
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query(&mut conn);
        }
    }
}

fn redis_store(
    case: &str,
) -> (
    Clean,
    impl FnOnce() -> Pin<Box<dyn Future<Output = RedisStore> + Send>> + Send + 'static,
) {
    let prefix = format!("{}:", fresh(&format!("trs-r2-{case}")));
    let clean = Clean(prefix.clone());
    (clean, move || {
        Box::pin(async move {
            let url =
                std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
            RedisStore::connect(&url)
                .await
                .expect("Redis on 127.0.0.1:6379")
                .prefix(prefix)
        })
    })
}

struct Seen {
    applied: usize,
    during: Vec<(StatusCode, bool)>,
    after: Vec<(StatusCode, bool)>,
}

impl Seen {
    fn assert_once(&self, keys: usize) {
        assert_eq!(
            self.applied, keys,
            "runs; during {:?} after {:?}",
            self.during, self.after
        );
        // 409 while it runs; a replay if it ended meanwhile; never a fresh answer.
        assert!(
            self.during
                .iter()
                .all(|(s, r)| *s == StatusCode::CONFLICT || (*s == StatusCode::OK && *r)),
            "repeats while running: {:?}",
            self.during
        );
        assert!(
            self.during.iter().any(|(s, _)| *s == StatusCode::CONFLICT),
            "no repeat met a running handler: {:?}",
            self.during
        );
        assert!(
            self.after.iter().all(|(s, r)| *s == StatusCode::OK && *r),
            "repeats after: {:?}",
            self.after
        );
    }
}

/// `keys` keyed requests at once (or one that disconnects, `detach`), repeats of each at 1.5
/// and 2.5 leases, and after they end (or at 4 leases if detached).
fn scenario<St, F, Fut>(
    flavour: Flavour,
    make_store: F,
    work: Work,
    busy: (usize, Duration),
    keys: usize,
    detach: bool,
) -> Seen
where
    St: IdempotencyStore,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = St>,
{
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (addr, applied, server) = serve_rt(flavour, LEASE, make_store, work, busy);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let keys: Vec<String> = (0..keys).map(|i| fresh(&format!("r{i}"))).collect();
    let started = Instant::now();
    let (during, after) = rt.block_on(async {
        let mut firsts = Vec::new();
        for k in &keys {
            let k = k.clone();
            if detach {
                send_and_disconnect(addr, &k).await;
            } else {
                firsts.push(tokio::spawn(async move { send(addr, &k).await }));
            }
        }
        // All of a wave at once: on one busy thread each takes a round to be answered.
        let wave = |keys: &[String]| {
            let sends: Vec<_> = keys
                .iter()
                .map(|k| {
                    let k = k.clone();
                    tokio::spawn(async move { send(addr, &k).await })
                })
                .collect();
            async move {
                let mut out = Vec::new();
                for s in sends {
                    out.push(s.await.unwrap());
                }
                out
            }
        };
        let mut during = Vec::new();
        tokio::time::sleep(LEASE.mul_f64(1.5)).await;
        during.extend(wave(&keys).await);
        tokio::time::sleep((LEASE.mul_f64(2.5)).saturating_sub(started.elapsed())).await;
        during.extend(wave(&keys).await);
        for f in firsts {
            f.await.unwrap();
        }
        if detach {
            tokio::time::sleep((LEASE * 4).saturating_sub(started.elapsed())).await;
        }
        let mut after = Vec::new();
        for k in &keys {
            after.push(send(addr, k).await);
        }
        (during, after)
    });
    drop(server);
    Seen {
        applied: applied.load(Ordering::SeqCst),
        during,
        after,
    }
}

/// Work of ~3.2 leases in stretches of `stretch`.
fn busy_for(stretch: Duration, rounds_share: usize) -> Work {
    let stretches =
        (LEASE.as_secs_f64() * 3.2 / (stretch.as_secs_f64() * rounds_share as f64)).ceil() as u32;
    Work::Busy { stretch, stretches }
}

// HELD. Twelve keyed handlers on one thread, each working 15 ms (0.0375 lease) between yields:
// the thread comes back to each every 0.45 lease (within the documented half lease).
#[test]
fn twelve_busy_handlers_on_one_thread_memory() {
    let stretch = Duration::from_millis(15);
    scenario(
        Flavour::CurrentThread,
        memory,
        busy_for(stretch, 12),
        (0, Duration::ZERO),
        12,
        false,
    )
    .assert_once(12);
}

// Redis on one thread: the documented floor is a quarter lease per round; 12 × 7 ms = 0.21.
#[test]
fn twelve_busy_handlers_on_one_thread_redis() {
    let stretch = Duration::from_millis(7);
    let (_clean, store) = redis_store("many");
    scenario(
        Flavour::CurrentThread,
        store,
        busy_for(stretch, 12),
        (0, Duration::ZERO),
        12,
        false,
    )
    .assert_once(12);
}

// A handler pending on I/O is never polled: only the ticker renews it. Two other tasks work
// 0.2 lease between yields (a round of 0.4 lease, within the documented half lease).
#[test]
fn a_handler_waiting_on_io_among_busy_tasks_one_thread_memory() {
    scenario(
        Flavour::CurrentThread,
        memory,
        Work::Pending { for_: LEASE * 3 },
        (2, LEASE.mul_f64(0.2)),
        1,
        false,
    )
    .assert_once(1);
}

// Same for Redis, two tasks of 0.1 lease (a round of 0.2 lease: within a quarter lease).
#[test]
fn a_handler_waiting_on_io_among_busy_tasks_one_thread_redis() {
    let (_clean, store) = redis_store("pending");
    scenario(
        Flavour::CurrentThread,
        store,
        Work::Pending { for_: LEASE * 3 },
        (2, LEASE.mul_f64(0.1)),
        1,
        false,
    )
    .assert_once(1);
}

// The response body is buffered inside `Renewal::during`: a body that streams over 3 leases
// (0.3 lease of work, then 0.2 lease of waiting, per chunk) keeps its claim.
#[test]
fn a_slowly_streamed_body_keeps_its_claim_one_thread_memory() {
    scenario(
        Flavour::CurrentThread,
        memory,
        Work::SlowBody {
            chunks: 6,
            stretch: LEASE.mul_f64(0.3),
            gap: LEASE.mul_f64(0.2),
        },
        (0, Duration::ZERO),
        1,
        false,
    )
    .assert_once(1);
}

#[test]
fn a_slowly_streamed_body_keeps_its_claim_multi_thread_redis() {
    let (_clean, store) = redis_store("body");
    scenario(
        Flavour::MultiThread,
        store,
        Work::SlowBody {
            chunks: 6,
            stretch: LEASE.mul_f64(0.45),
            gap: LEASE.mul_f64(0.05),
        },
        (0, Duration::ZERO),
        1,
        false,
    )
    .assert_once(1);
}

// A detached call (the client went away at 50 ms) keeps renewing on a current-thread runtime.
#[test]
fn a_detached_call_keeps_its_claim_one_thread_memory() {
    scenario(
        Flavour::CurrentThread,
        memory,
        busy_for(LEASE.mul_f64(0.3), 1),
        (0, Duration::ZERO),
        1,
        true,
    )
    .assert_once(1);
}

#[test]
fn a_detached_call_keeps_its_claim_one_thread_redis() {
    let (_clean, store) = redis_store("detached");
    scenario(
        Flavour::CurrentThread,
        store,
        busy_for(LEASE.mul_f64(0.2), 1),
        (0, Duration::ZERO),
        1,
        true,
    )
    .assert_once(1);
}

// Redis on a multi-thread runtime: a handler working 0.45 lease between yields (so each of its
// polls renews from its own task, whose Redis reply must wait for a spawned task) while one
// other task is busy too, 0.45 lease between yields: a free worker only at times.
#[test]
fn redis_multi_thread_handler_renewing_itself_among_a_busy_task() {
    let (_clean, store) = redis_store("mt");
    scenario(
        Flavour::MultiThread,
        store,
        busy_for(LEASE.mul_f64(0.45), 1),
        (1, LEASE.mul_f64(0.45)),
        1,
        false,
    )
    .assert_once(1);
}

// DEFECT (renewal, current-thread). A keyed handler waiting on I/O (here a timer; a socket is
// the same) while two unrelated tasks hand a token back and forth over channels, each working
// 8 ms (0.02 lease) per turn. Every stretch is far under the documented half lease, and so is a
// round of all busy tasks (16 ms: each has had its turn). But the docs' model — "it reads its
// timers only when every task ready to run has had its turn" — is not tokio's: tasks that wake
// each other directly (a channel, a Notify; not `yield_now`, which defers its wake until after
// the driver) never empty the run queue, and the current-thread scheduler then polls its
// drivers only once every `event_interval` = 61 task polls: 61 × 8 ms ≈ 490 ms > the 400 ms
// lease. The ticker's timer fires that late, the pending handler is not polled either (its
// wake comes from the same driver), so nothing renews the claim for over a lease; the repeat,
// accepted at the next driver poll, finds the key free and runs the handler a second time.
// Seen (3 of 3 runs): runs 2; the repeat at 1.5 leases got a fresh 200, not 409.
//
// Proposed fix: the ticker must not depend on the runtime's timer driver on a current-thread
// runtime: run it on a thread of the layer's own (`std::thread` + `std::thread::sleep`, or a
// one-thread runtime of its own) that sends renewals itself — directly for `MemoryStore`
// (synchronous), and through a connection owned by that thread for `RedisStore` /
// `PostgresStore` (a store-level "renewal channel"). Failing that, correct the guarantee: on a
// current-thread runtime the bound is the work of up to `event_interval` (61) task polls
// between two driver polls, whatever the round; advise `Builder::event_interval(1..=8)` or a
// multi-thread runtime.
#[test]
#[ignore = "known limit, documented (server docs, Renewal guarantee): on a current-thread runtime, tasks that wake each other delay timer reads to every 61 polls"]
fn a_handler_waiting_on_io_while_two_tasks_ping_pong_one_thread_memory() {
    scenario(
        Flavour::CurrentThread,
        memory,
        Work::Pending { for_: LEASE * 3 },
        (usize::MAX, Duration::from_millis(8)),
        1,
        false,
    )
    .assert_once(1);
}

// HELD. The same on a multi-thread runtime (2 workers): the ping-pong stays on one worker (its
// LIFO slot), the other polls the drivers and runs the ticker.
#[test]
fn a_handler_waiting_on_io_while_two_tasks_ping_pong_multi_thread_memory() {
    scenario(
        Flavour::MultiThread,
        memory,
        Work::Pending { for_: LEASE * 3 },
        (usize::MAX, Duration::from_millis(8)),
        1,
        false,
    )
    .assert_once(1);
}

// DEFECT (same root cause as the ping-pong test above, on the case the guarantee is written
// for). A keyed handler that yields (`yield_now`) after every 10 ms (0.025 lease) of work, on
// one thread with the same ping-pong pair. `yield_now` defers its wake until after the next
// driver poll, which the ping-pong puts 61 polls (~0.5 s) apart: the thread comes back to the
// handler about once per 1.2 leases, though by the docs' own reckoning (its stretch plus one
// turn of each busy task, 26 ms) it should come back every 0.065 lease. Seen: runs 2.
#[test]
#[ignore = "known limit, documented (server docs, Renewal guarantee): on a current-thread runtime, tasks that wake each other keep a yielding handler from its next poll for 61 polls"]
fn a_yielding_handler_while_two_tasks_ping_pong_one_thread_memory() {
    scenario(
        Flavour::CurrentThread,
        memory,
        // Six stretches: with the handler polled every ~0.5 s, about 3 s in all.
        Work::Busy {
            stretch: Duration::from_millis(10),
            stretches: 6,
        },
        (usize::MAX, Duration::from_millis(8)),
        1,
        false,
    )
    .assert_once(1);
}

// HELD: the diagnosis of the two ping-pong defects. The same two cases with the runtime's
// drivers polled every 4 task polls (`Builder::event_interval(4)`) keep their claims.
#[test]
fn ping_pong_cases_hold_with_event_interval_4() {
    scenario(
        Flavour::CurrentThreadEventInterval4,
        memory,
        Work::Pending { for_: LEASE * 3 },
        (usize::MAX, Duration::from_millis(8)),
        1,
        false,
    )
    .assert_once(1);
    scenario(
        Flavour::CurrentThreadEventInterval4,
        memory,
        Work::Busy {
            stretch: Duration::from_millis(10),
            stretches: 40,
        },
        (usize::MAX, Duration::from_millis(8)),
        1,
        false,
    )
    .assert_once(1);
}
