//! The server layer's instruments against the answers it gave: each keyed request counted once
//! by how it was answered, lease renewals while a handler runs, and atomic mode's
//! transactions over PostgreSQL by how they ended.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use retry_safety_testing::meters::{Meters, Recorded};
use retry_safety_testing::pg;
use tokio::sync::Notify;
use tower::{service_fn, Layer, ServiceExt};
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};

/// The server layer over the memory store: each keyed request is counted once by how it was
/// answered — claimed, answered from the stored response, 409 while in flight, 422 for a key
/// reused with another request, 400 for a malformed or missing key — and a request without a
/// key is not counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_layer_counts_each_keyed_answer_once() {
    let meters = Meters::new();
    let gate = Arc::new(Notify::new());
    let entered = Arc::new(Notify::new());
    let (handler_gate, handler_entered) = (gate.clone(), entered.clone());
    let layer = IdempotencyLayer::new(MemoryStore::new())
        .require_key_for([Method::PATCH])
        .meter(meters.meter());
    let svc = layer.layer(service_fn(move |req: Request<_>| {
        let (gate, entered) = (handler_gate.clone(), handler_entered.clone());
        async move {
            if req.uri().path() == "/slow" {
                entered.notify_one();
                gate.notified().await;
            }
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
        }
    }));
    let send = |method: Method, path: &str, key: Option<&str>, body: &'static str| {
        let mut req = Request::builder().method(method).uri(path);
        if let Some(key) = key {
            req = req.header("idempotency-key", key);
        }
        svc.clone().oneshot(
            req.body(Full::new(Bytes::from_static(body.as_bytes())))
                .expect("request"),
        )
    };
    let status = |res: Result<Response<_>, Infallible>| match res {
        Ok(res) => res.status(),
        Err(never) => match never {},
    };

    assert_eq!(
        status(send(Method::POST, "/a", Some("\"a\""), "x").await),
        StatusCode::OK
    );
    for _ in 0..3 {
        let res = send(Method::POST, "/a", Some("\"a\""), "x").await;
        let res = res.unwrap_or_else(|never| match never {});
        assert_eq!(res.headers()["idempotent-replayed"], "true");
    }
    assert_eq!(
        status(send(Method::POST, "/a", Some("\"a\""), "other").await),
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(
        status(send(Method::POST, "/a", Some("\"unterminated"), "x").await),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        status(send(Method::PATCH, "/a", None, "x").await),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        status(send(Method::POST, "/a", None, "x").await),
        StatusCode::OK
    );

    // A repeat while the first still runs: 409, twice; then the first ends.
    let first = tokio::spawn(send(Method::POST, "/slow", Some("\"slow\""), "x"));
    // The handler runs once the key is claimed.
    entered.notified().await;
    for _ in 0..2 {
        assert_eq!(
            status(send(Method::POST, "/slow", Some("\"slow\""), "x").await),
            StatusCode::CONFLICT
        );
    }
    gate.notify_one();
    let first = first.await.expect("the first request's task");
    assert_eq!(status(first), StatusCode::OK);

    keyed_outcomes_counted_once(&meters.read());
}

/// Two claims, three stored responses, one mismatch, one malformed and one missing key, two
/// answered in flight: ten keyed requests, each counted once with its method and outcome.
fn keyed_outcomes_counted_once(got: &Recorded) {
    let outcome = |o: &str| {
        got.sum_where(
            "retry_safety.server.keyed_requests",
            "retry_safety.key.outcome",
            o,
        )
    };
    assert_eq!(outcome("claimed"), 2);
    assert_eq!(outcome("stored-response"), 3);
    assert_eq!(outcome("mismatch"), 1);
    assert_eq!(outcome("malformed-key"), 1);
    assert_eq!(outcome("missing-key"), 1);
    assert_eq!(outcome("in-flight"), 2);
    assert_eq!(outcome("store-error"), 0);
    assert_eq!(got.total("retry_safety.server.keyed_requests"), 10);
    assert_eq!(got.unit("retry_safety.server.keyed_requests"), "{request}");
    for (attributes, _) in got.sums("retry_safety.server.keyed_requests") {
        assert_eq!(
            attributes.keys().map(String::as_str).collect::<Vec<_>>(),
            ["http.request.method", "retry_safety.key.outcome"]
        );
    }
}

/// A handler that outlasts its claim's lease: the lease is renewed while it runs, and each
/// renewal is counted as renewed (none fenced: no other claim took the key).
#[tokio::test(start_paused = true)]
async fn lease_renewals_are_counted_while_a_handler_runs() {
    let meters = Meters::new();
    let layer = IdempotencyLayer::new(MemoryStore::new())
        .lease(Duration::from_millis(40))
        .meter(meters.meter());
    let svc = layer.layer(service_fn(|_req: Request<_>| async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
    }));
    let req = Request::post("/v1/send")
        .header("idempotency-key", "\"slow\"")
        .body(Full::new(Bytes::from_static(b"x")))
        .expect("request");
    let res = svc
        .oneshot(req)
        .await
        .unwrap_or_else(|never| match never {});
    assert_eq!(res.status(), StatusCode::OK);
    let got = meters.read();
    let result = |r: &str| {
        got.sum_where(
            "retry_safety.server.lease.renewals",
            "retry_safety.renewal.result",
            r,
        )
    };
    // 400 ms of a 40 ms lease renewed every quarter of it, at most a third apart.
    assert!(
        result("renewed") >= 400 / 14,
        "renewed {}",
        result("renewed")
    );
    assert_eq!(result("fenced"), 0);
    assert_eq!(result("failed"), 0);
    assert_eq!(got.unit("retry_safety.server.lease.renewals"), "{renewal}");
}

/// Atomic mode over PostgreSQL (feature `postgres`): the keyed answers are counted as in lease
/// mode, and each keyed transaction once by how it ended — committed with the handler's
/// response, or rolled back when the handler failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atomic_mode_counts_commits_and_rollbacks() {
    use http_body_util::Either;
    use tower::BoxError;
    use tower_idempotency_keys::stores::PostgresStore;

    let meters = Meters::new();
    let db = pg::TestDb::new().await;
    let store = PostgresStore::from_pool(db.pool(4).await);
    store.migrate().await.expect("migrate");
    let layer = IdempotencyLayer::new(store).meter(meters.meter()).atomic();
    type Body = Either<Full<Bytes>, Full<Bytes>>;
    let svc = layer.layer(service_fn(|req: Request<Body>| async move {
        if req.uri().path() == "/fail" {
            return Err::<Response<Full<Bytes>>, BoxError>("the handler failed".into());
        }
        let mut res = Response::new(Full::new(Bytes::from_static(b"created")));
        *res.status_mut() = StatusCode::CREATED;
        Ok(res)
    }));
    let send = |path: &str, key: &str, body: &'static str| {
        let req = Request::post(path)
            .header("idempotency-key", key)
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .expect("request");
        svc.clone().oneshot(req)
    };
    let status = |res: Result<Response<_>, BoxError>| res.map(|r| r.status().as_u16()).ok();

    assert_eq!(status(send("/ok", "\"a\"", "x").await), Some(201));
    assert_eq!(status(send("/ok", "\"a\"", "x").await), Some(201));
    assert_eq!(status(send("/ok", "\"a\"", "other").await), Some(422));
    assert_eq!(status(send("/ok", "\"unterminated", "x").await), Some(400));
    assert_eq!(status(send("/fail", "\"b\"", "x").await), None);

    let got = meters.read();
    let outcome = |o: &str| {
        got.sum_where(
            "retry_safety.server.keyed_requests",
            "retry_safety.key.outcome",
            o,
        )
    };
    assert_eq!(outcome("claimed"), 2);
    assert_eq!(outcome("stored-response"), 1);
    assert_eq!(outcome("mismatch"), 1);
    assert_eq!(outcome("malformed-key"), 1);
    assert_eq!(got.total("retry_safety.server.keyed_requests"), 5);
    let ended = |r: &str| {
        got.sum_where(
            "retry_safety.server.atomic.transactions",
            "retry_safety.transaction.result",
            r,
        )
    };
    assert_eq!(ended("committed"), 1);
    assert_eq!(ended("rolled-back"), 1);
    assert_eq!(got.total("retry_safety.server.atomic.transactions"), 2);
}
