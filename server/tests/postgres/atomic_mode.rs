//! Atomic mode on real PostgreSQL and real sockets: the handler's rows and the key commit in
//! one transaction. Each test works in a schema of its own (dropped at its end); counts are
//! exact.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::pg::{client, fresh, post, serve, TestDb};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use tower::{service_fn, BoxError, ServiceBuilder};
use tower_idempotency_keys::{stores::PostgresStore, IdempotencyLayer, KeyTransaction, RequestKey};

type Req = Request<Either<Full<Bytes>, Incoming>>;

/// How many times each path's handler was entered (a run that rolled back counts too).
#[derive(Default)]
struct Calls {
    flaky: AtomicU32,
    panicky: AtomicU32,
}

/// Inserts one order per run, in the request's transaction, then behaves as its path says.
async fn handler(calls: Arc<Calls>, req: Req) -> Result<Response<Full<Bytes>>, BoxError> {
    let path = req.uri().path().to_owned();
    let sleep_ms: u64 = req
        .uri()
        .query()
        .and_then(|q| q.strip_prefix("sleep="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let key = req
        .extensions()
        .get::<RequestKey>()
        .map(|k| k.as_str().to_owned());
    let tx = KeyTransaction::of(&req).cloned();
    let note = String::from_utf8_lossy(&req.into_body().collect().await?.to_bytes()).into_owned();
    let (Some(key), Some(tx)) = (key, tx) else {
        return Ok(Response::new(Full::new(Bytes::from("no key"))));
    };
    let mut conn = tx.acquire().await?;
    if path == "/abort" {
        // A failing statement aborts the transaction; the handler answers 409 on its own.
        let failed = sqlx::query("SELECT 1 / 0").execute(&mut *conn).await;
        assert!(failed.is_err());
        let mut res = Response::new(Full::new(Bytes::from("refused")));
        *res.status_mut() = StatusCode::CONFLICT;
        return Ok(res);
    }
    let id: i64 = sqlx::query_scalar("INSERT INTO orders (key, note) VALUES ($1, $2) RETURNING id")
        .bind(&key)
        .bind(&note)
        .fetch_one(&mut *conn)
        .await?;
    if sleep_ms > 0 {
        tokio::time::sleep(Duration::from_millis(sleep_ms)).await;
    }
    match path.as_str() {
        "/flaky" if calls.flaky.fetch_add(1, Ordering::SeqCst) == 0 => {
            return Err("the first run fails after its write".into())
        }
        "/panicky" if calls.panicky.fetch_add(1, Ordering::SeqCst) == 0 => {
            panic!("the first run panics after its write")
        }
        "/commit-itself" => {
            sqlx::query("COMMIT").execute(&mut *conn).await?;
        }
        "/hold" => {
            // A task of the handler's keeps the connection past the response.
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                drop(conn);
            });
            let mut res = Response::new(Full::new(Bytes::from("held")));
            *res.status_mut() = StatusCode::CREATED;
            return Ok(res);
        }
        _ => {}
    }
    drop(conn);
    let mut res = Response::new(Full::new(Bytes::from(format!("order {id}: {note}"))));
    *res.status_mut() = StatusCode::CREATED;
    Ok(res)
}

/// A server on 127.0.0.1 with the atomic layer over its own pool in `db`'s schema.
async fn server(db: &TestDb, calls: Arc<Calls>) -> std::net::SocketAddr {
    server_with(db, calls, 16).await
}

/// [`server`] with a pool of `connections`.
async fn server_with(db: &TestDb, calls: Arc<Calls>, connections: u32) -> std::net::SocketAddr {
    let store = PostgresStore::from_pool(db.pool(connections).await);
    store.migrate().await.unwrap();
    let layer = IdempotencyLayer::new(store)
        .max_request_bytes(1024)
        .scope_keys_by(|req| {
            Some(
                req.headers
                    .get("x-tenant")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("anyone")
                    .to_owned(),
            )
        })
        .atomic();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(move |req| handler(calls.clone(), req)));
    serve(svc).await
}

async fn orders(db: &TestDb, key: &str) -> i64 {
    db.count(&format!("SELECT count(*) FROM orders WHERE key = '{key}'"))
        .await
}

/// Rows of the client's key `key` (stored after its scope's hash).
async fn keys_for(db: &TestDb, key: &str) -> i64 {
    db.count(&format!(
        "SELECT count(*) FROM idempotency_keys WHERE key LIKE '%|{key}'"
    ))
    .await
}

async fn keys(db: &TestDb) -> i64 {
    db.count("SELECT count(*) FROM idempotency_keys").await
}

#[tokio::test]
async fn a_key_runs_once_and_repeats_get_the_stored_response_or_422() {
    let db = TestDb::new().await;
    let addr = server(&db, Arc::default()).await;
    let c = client();
    let key = fresh("k");
    let first = post(&c, addr, "/orders", &key, "one").await.unwrap();
    assert_eq!((first.0, first.1), (201, false));
    for _ in 0..3 {
        let again = post(&c, addr, "/orders", &key, "one").await.unwrap();
        assert_eq!(again, (201, true, first.2.clone()));
    }
    let other = post(&c, addr, "/orders", &key, "two").await.unwrap();
    assert_eq!(other.0, 422);
    assert_eq!(orders(&db, &key).await, 1);
    assert_eq!(keys(&db).await, 1);
}

/// A refused claim (a stored response, a 422) fails its statement before `BEGIN` takes effect: the
/// connection goes back to the pool idle and clean. With one connection, every request after
/// the refusals reuses it.
#[tokio::test]
async fn refused_claims_leave_the_connection_clean() {
    let db = TestDb::new().await;
    let addr = server_with(&db, Arc::default(), 1).await;
    let c = client();
    let key = fresh("k");
    assert_eq!(post(&c, addr, "/orders", &key, "one").await.unwrap().0, 201);
    for _ in 0..5 {
        assert!(post(&c, addr, "/orders", &key, "one").await.unwrap().1);
        assert_eq!(post(&c, addr, "/orders", &key, "two").await.unwrap().0, 422);
    }
    for _ in 0..3 {
        let other = fresh("k");
        let ran = post(&c, addr, "/orders", &other, "x").await.unwrap();
        assert_eq!((ran.0, ran.1), (201, false));
        assert_eq!(orders(&db, &other).await, 1);
    }
    assert_eq!(keys(&db).await, 4);
}

#[tokio::test]
async fn a_concurrent_repeat_gets_409_at_once_never_waits() {
    let db = TestDb::new().await;
    let addr = server(&db, Arc::default()).await;
    let key = fresh("k");
    let first = {
        let key = key.clone();
        tokio::spawn(async move { post(&client(), addr, "/orders?sleep=800", &key, "x").await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let c = client();
    let started = Instant::now();
    let repeat = post(&c, addr, "/orders?sleep=800", &key, "x")
        .await
        .unwrap();
    let waited = started.elapsed();
    assert_eq!(repeat.0, 409);
    assert!(
        waited < Duration::from_millis(200),
        "the repeat waited {waited:?}"
    );
    let first = first.await.unwrap().unwrap();
    assert_eq!((first.0, first.1), (201, false));
    let repeat = post(&c, addr, "/orders?sleep=800", &key, "x")
        .await
        .unwrap();
    assert_eq!(repeat, (201, true, first.2));
    assert_eq!(orders(&db, &key).await, 1);
    println!("409 for a concurrent repeat in {waited:?}");
}

#[tokio::test]
async fn a_handler_that_fails_or_panics_after_its_write_leaves_nothing() {
    let db = TestDb::new().await;
    let calls = Arc::new(Calls::default());
    let addr = server(&db, calls.clone()).await;
    let c = client();
    for path in ["/flaky", "/panicky"] {
        let key = fresh("k");
        // The first run writes, then fails (hyper closes the connection on the error) or
        // panics: rolled back, the key stays free.
        assert!(post(&c, addr, path, &key, "x").await.is_err(), "{path}");
        assert_eq!(
            orders(&db, &key).await,
            0,
            "{path}: the write was rolled back"
        );
        assert_eq!(keys_for(&db, &key).await, 0, "{path}: the key is free");
        // The repeat runs on a clean slate.
        let again = post(&c, addr, path, &key, "x").await.unwrap();
        assert_eq!((again.0, again.1), (201, false), "{path}");
        assert_eq!(orders(&db, &key).await, 1, "{path}");
    }
    assert_eq!(calls.flaky.load(Ordering::SeqCst), 2);
    assert_eq!(calls.panicky.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_handler_that_commits_itself_is_a_reported_error_never_a_second_run() {
    let db = TestDb::new().await;
    let addr = server(&db, Arc::default()).await;
    let c = client();
    let key = fresh("k");
    let first = post(&c, addr, "/commit-itself", &key, "x").await.unwrap();
    assert_eq!(first.0, 500);
    assert!(first
        .2
        .contains("ended the request's database transaction itself"));
    // Its write committed (by its own COMMIT); the key keeps the unknown outcome.
    assert_eq!(orders(&db, &key).await, 1);
    let again = post(&c, addr, "/commit-itself", &key, "x").await.unwrap();
    assert_eq!((again.0, again.1), (500, true));
    assert_eq!(orders(&db, &key).await, 1, "never run again");
}

#[tokio::test]
async fn a_handler_still_holding_the_transaction_is_a_reported_error_never_a_second_run() {
    let db = TestDb::new().await;
    let addr = server(&db, Arc::default()).await;
    let c = client();
    let key = fresh("k");
    let first = post(&c, addr, "/hold", &key, "x").await.unwrap();
    assert_eq!(first.0, 500);
    assert!(first
        .2
        .contains("ended the request's database transaction itself"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The transaction was dropped with the handler's task, never committed.
    assert_eq!(orders(&db, &key).await, 0);
    let again = post(&c, addr, "/hold", &key, "x").await.unwrap();
    assert_eq!((again.0, again.1), (500, true));
    assert_eq!(orders(&db, &key).await, 0);
}

#[tokio::test]
async fn a_statement_that_failed_returns_the_handlers_answer_unstored() {
    let db = TestDb::new().await;
    let addr = server(&db, Arc::default()).await;
    let c = client();
    let key = fresh("k");
    let first = post(&c, addr, "/abort", &key, "x").await.unwrap();
    assert_eq!(first, (409, false, "refused".to_owned()));
    assert_eq!(keys(&db).await, 0);
}

#[tokio::test]
async fn a_client_that_goes_away_leaves_the_run_to_commit() {
    let db = TestDb::new().await;
    let addr = server(&db, Arc::default()).await;
    let c = client();
    let key = fresh("k");
    let gone = tokio::time::timeout(
        Duration::from_millis(100),
        post(&c, addr, "/orders?sleep=400", &key, "x"),
    )
    .await;
    assert!(gone.is_err(), "the client gave up");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(orders(&db, &key).await, 1);
    let again = post(&c, addr, "/orders?sleep=400", &key, "x")
        .await
        .unwrap();
    assert_eq!((again.0, again.1), (201, true));
    assert_eq!(orders(&db, &key).await, 1);
}

#[tokio::test]
async fn bad_input_gets_a_clear_4xx_and_touches_nothing() {
    let db = TestDb::new().await;
    let addr = server(&db, Arc::default()).await;
    let c = client();
    let send = |key: http::HeaderValue, body: Vec<u8>| {
        let req = Request::post(format!("http://{addr}/orders"))
            .header("idempotency-key", key)
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let c = c.clone();
        async move { c.request(req).await.unwrap().status() }
    };
    let long = http::HeaderValue::from_str(&"k".repeat(256)).unwrap();
    assert_eq!(send(long, b"x".to_vec()).await, StatusCode::BAD_REQUEST);
    let not_utf8 = http::HeaderValue::from_bytes(b"\"k-\xff\xfe\"").unwrap();
    assert_eq!(send(not_utf8, b"x".to_vec()).await, StatusCode::BAD_REQUEST);
    let ok_key = http::HeaderValue::from_static("\"k-big\"");
    assert_eq!(
        send(ok_key, vec![b'x'; 2048]).await,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    assert_eq!(db.count("SELECT count(*) FROM orders").await, 0);
    assert_eq!(keys(&db).await, 0);
}

#[tokio::test]
async fn one_tenants_key_never_gets_anothers_stored_response() {
    let db = TestDb::new().await;
    let addr = server(&db, Arc::default()).await;
    let c = client();
    let key = fresh("k");
    let as_tenant = |tenant: &'static str| {
        let req = Request::post(format!("http://{addr}/orders"))
            .header("idempotency-key", format!("\"{key}\""))
            .header("x-tenant", tenant)
            .body(Full::new(Bytes::from(tenant)))
            .unwrap();
        let c = c.clone();
        async move {
            let res = c.request(req).await.unwrap();
            let stored = res.headers().contains_key("idempotent-replayed");
            let body = res.into_body().collect().await.unwrap().to_bytes();
            (stored, body)
        }
    };
    let (replayed_a, body_a) = as_tenant("a").await;
    let (replayed_b, body_b) = as_tenant("b").await;
    assert!(!replayed_a && !replayed_b);
    assert_ne!(body_a, body_b);
    assert_eq!(as_tenant("a").await, (true, body_a));
    assert_eq!(orders(&db, &key).await, 2);
    assert_eq!(keys(&db).await, 2);
}

/// 64 concurrent repeats of one key, spread over two instances (two layers, two pools, two
/// sockets): one run; every other caller gets 409 at first, then the stored response.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_repeats_across_two_instances_run_once() {
    let db = TestDb::new().await;
    let instances = [
        server(&db, Arc::default()).await,
        server(&db, Arc::default()).await,
    ];
    let key = fresh("k");
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..64 {
        let (key, addr) = (key.clone(), instances[i % 2]);
        tasks.spawn(async move {
            let c = client();
            let mut conflicts = 0;
            loop {
                let (status, stored, body) = post(&c, addr, "/orders?sleep=300", &key, "x")
                    .await
                    .unwrap();
                if status == 409 {
                    conflicts += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                assert_eq!(status, 201);
                return (stored, conflicts, body);
            }
        });
    }
    let (mut runs, mut repeats, mut saw_409) = (0, 0, 0);
    let mut bodies = std::collections::HashSet::new();
    while let Some(done) = tasks.join_next().await {
        let (stored, conflicts, body) = done.unwrap();
        if stored {
            repeats += 1;
        } else {
            runs += 1;
        }
        if conflicts > 0 {
            saw_409 += 1;
        }
        bodies.insert(body);
    }
    assert_eq!((runs, repeats), (1, 63));
    assert_eq!(saw_409, 63, "every repeat met the run in flight first");
    assert_eq!(bodies.len(), 1, "every caller got the same response");
    assert_eq!(orders(&db, &key).await, 1);
}

/// The axum extractors find the request's key and transaction where the layer put them.
#[cfg(feature = "axum")]
#[tokio::test]
async fn axum_extractors_take_the_key_and_the_transaction() {
    use axum_core::extract::FromRequestParts;
    use axum_core::response::IntoResponse;
    let db = TestDb::new().await;
    let store = PostgresStore::from_pool(db.pool(4).await);
    store.migrate().await.unwrap();
    let svc = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store).atomic())
        .service(service_fn(|req: Req| async move {
            let (mut parts, _body) = req.into_parts();
            let key = match RequestKey::from_request_parts(&mut parts, &()).await {
                Ok(key) => key,
                Err(rejection) => {
                    let res = rejection.into_response();
                    let mut out = Response::new(Full::new(Bytes::from("rejected")));
                    *out.status_mut() = res.status();
                    return Ok::<_, BoxError>(out);
                }
            };
            let tx = KeyTransaction::from_request_parts(&mut parts, &())
                .await
                .map_err(|e| e.to_string())?;
            let mut conn = tx.acquire().await?;
            sqlx::query("INSERT INTO orders (key, note) VALUES ($1, 'axum')")
                .bind(key.as_str())
                .execute(&mut *conn)
                .await?;
            Ok(Response::new(Full::new(Bytes::from("ok"))))
        }));
    let addr = serve(svc).await;
    let c = client();
    let key = fresh("k");
    assert_eq!(post(&c, addr, "/", &key, "x").await.unwrap().0, 200);
    assert!(
        post(&c, addr, "/", &key, "x").await.unwrap().1,
        "a stored response"
    );
    assert_eq!(orders(&db, &key).await, 1);
    // Without a key: the extractor's 400.
    let req = Request::post(format!("http://{addr}/"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(c.request(req).await.unwrap().status(), 400);
}
