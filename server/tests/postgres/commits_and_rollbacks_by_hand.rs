//! Atomic mode on real PostgreSQL and real sockets: transactions a handler ends by hand (a
//! COMMIT or a ROLLBACK, then an error, a declined 5xx, a panic or a success), or holds from a
//! spawned task past the layer's wait. Handlers count their side effects; counts are exact.
//! From the review, round 2, of the PostgreSQL store's atomic/lease modes (ac4e316).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::keyed_request::{key_of, Req};
use crate::pg::{client, fresh, post, serve, TestDb};
use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use tower::{service_fn, BoxError, ServiceBuilder};
use tower_idempotency_keys::{stores::PostgresStore, IdempotencyLayer, KeyTransaction};

/// Writes the order in the request's transaction, then `COMMIT`s by hand (the misuse the
/// layer promises to catch: "answers 500, keeps an entry that says the outcome is unknown").
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
// the whole TTL and its outcome (\"unknown\") is never stored — the order IS committed. The
// docs promise a hand-made COMMIT "answers 500, keeps an entry that says the outcome is
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
/// Found by the adversarial review, round 2, of the PostgreSQL store's modes.
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
// and answers 503. The 5xx check runs before the entry is written (the write is what notices
// a hand-ended transaction, through the LOCKED setting), so the layer rolls back (nothing) and
// passes the 503 through, which under `store_server_errors(false)` tells the client that
// nothing was applied — yet the order committed. The in-flight row committed with the hand-made
// COMMIT holds the key for the TTL: every repeat gets 409 for 24 h; the outcome is never
// stored. Seen: runs 1, orders 1, first 503, repeat 409, one in-flight row.
//
// Proposed fix: as above — check `current_setting('<LOCKED>', true)` in the transaction before
// the declined-5xx rollback, and treat a gone setting as `handler_kept_the_transaction`.
/// Found by the adversarial review, round 2, of the PostgreSQL store's modes.
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
// the key is free and nothing notes the autocommitted write. The client's repeat (a service
// error is a dropped connection: the retry layer repeats it with the same key) runs the
// handler again. Seen: runs 2, orders 2 (1 expected, the repeat answered with the stored
// unknown outcome, 500).
//
// Proposed fix: the same check as for a hand-made COMMIT — on the error path (and the declined
// 5xx, aborted and panic paths), read `current_setting('<LOCKED>', true)` in the transaction
// before rolling back; gone means the handler ended it: `handler_kept_the_transaction(Some(tx))`
// (which writes the unknown outcome) instead of `roll_back(tx)`.
/// Found by the adversarial review, round 2, of the PostgreSQL store's modes.
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
/// Found by the adversarial review, round 2, of the PostgreSQL store's modes.
#[tokio::test]
async fn roll_back_by_hand_write_then_success_is_stored_as_unknown() {
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
/// Found by the adversarial review, round 2, of the PostgreSQL store's modes.
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
    // The waiter's rollback and entry take a moment after the holder lets go.
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

// DEFECT (same root cause). A handler that COMMITs by hand and then panics: the panic unwinds
// through `Run::call`, the transaction is dropped (a rollback of nothing), and no unknown
// outcome is written: the committed in-flight row holds the key for the TTL (409 for 24 h),
// the order committed. Seen: runs 1, orders 1, repeat 409, one in-flight row.
//
// Proposed fix: a drop guard in `Run::call` (armed while the handler runs) that, on unwind,
// spawns the LOCKED check on the transaction and `settle_unknown` when it is gone.
/// Found by the adversarial review, round 2, of the PostgreSQL store's modes.
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

// HELD. Hand COMMIT + 201: stored as unknown (500), repeats get the 500, one run.
/// Found by the adversarial review, round 2, of the PostgreSQL store's modes.
#[tokio::test]
async fn commit_by_hand_then_success_is_stored_as_unknown() {
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
