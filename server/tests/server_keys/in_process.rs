//! `IdempotencyLayer` in process: what is stored, what is freed, what is refused.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};

type In = Request<Either<Full<Bytes>, Full<Bytes>>>;

fn keyed(key: &str, body: &'static str) -> Request<Full<Bytes>> {
    Request::post("/v1/messages")
        .header("idempotency-key", format!("\"{key}\""))
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

async fn body_of<B: http_body::Body>(res: Response<B>) -> Bytes
where
    B::Error: std::fmt::Debug,
{
    res.into_body().collect().await.unwrap().to_bytes()
}

/// Counts runs; answers with `status`, a header and a body of `len` bytes.
fn handler(
    runs: Arc<AtomicU32>,
    status: u16,
    len: usize,
) -> impl Service<In, Response = Response<Full<Bytes>>, Error = Infallible, Future = impl Send>
       + Clone
       + Send {
    service_fn(move |_req: In| {
        runs.fetch_add(1, Ordering::SeqCst);
        async move {
            let mut res = Response::new(Full::new(Bytes::from(vec![b'x'; len])));
            *res.status_mut() = StatusCode::from_u16(status).unwrap();
            res.headers_mut()
                .insert("x-charge-id", "ch_1".parse().unwrap());
            Ok(res)
        }
    })
}

#[tokio::test]
async fn every_status_is_stored_and_sent_again_byte_for_byte() {
    let runs = Arc::new(AtomicU32::new(0));
    let layer = IdempotencyLayer::new(MemoryStore::new());
    let svc = layer.layer(handler(runs.clone(), 500, 10));
    let first = svc.clone().oneshot(keyed("a", "x")).await.unwrap();
    let again = svc.clone().oneshot(keyed("a", "x")).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(first.status(), 500);
    assert_eq!(again.status(), 500);
    assert_eq!(again.headers()["x-charge-id"], "ch_1");
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(body_of(first).await, body_of(again).await);
}

/// The handler was called and failed: it may have applied, so its key is never run again.
#[tokio::test]
async fn an_inner_error_keeps_an_unknown_outcome_for_the_key() {
    let layer = IdempotencyLayer::new(MemoryStore::new());
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let svc = layer.layer(service_fn(move |_req: In| {
        let n = c.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                Err::<Response<Full<Bytes>>, BoxError>("backend down after the write".into())
            } else {
                Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
            }
        }
    }));
    assert!(svc.clone().oneshot(keyed("e", "x")).await.is_err());
    let res = svc.oneshot(keyed("e", "x")).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1, "never run twice");
    assert_eq!(res.status(), 500);
    assert_eq!(res.headers()["idempotent-replayed"], "true");
    assert_eq!(res.headers()["x-should-retry"], "false");
    let text = String::from_utf8_lossy(&body_of(res).await).into_owned();
    assert!(text.contains("may have applied"), "{text}");
}

#[tokio::test]
async fn a_response_over_the_limit_passes_through_and_its_head_is_kept() {
    let runs = Arc::new(AtomicU32::new(0));
    let layer = IdempotencyLayer::new(MemoryStore::new()).max_response_bytes(100);
    let svc = layer.layer(handler(runs.clone(), 201, 1000));
    let res = svc.clone().oneshot(keyed("big", "x")).await.unwrap();
    assert_eq!(body_of(res).await.len(), 1000, "nothing lost");
    let again = svc.clone().oneshot(keyed("big", "x")).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never run twice");
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["x-charge-id"], "ch_1");
    assert_eq!(again.headers()["idempotent-replay-body"], "omitted");
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert!(body_of(again).await.is_empty());
}

/// The store cannot hold even the response's head: the key is held in flight (409) past its
/// lease, never freed. Found in review: the lease used to lapse and a repeat ran it again.
/// The scope (here an API key header) never reaches a log.
#[test]
fn a_store_that_refuses_the_stored_response_holds_the_key_past_its_lease() {
    let (logs, ()) = retry_safety_testing::logs::capture(|| {
        retry_safety_testing::logs::block_on(async {
            let runs = Arc::new(AtomicU32::new(0));
            // Room for a claim (key + 64 bytes), not for any entry.
            let layer = IdempotencyLayer::new(MemoryStore::with_limits(16, 200))
                .lease(Duration::from_millis(200))
                .scope_keys_by_header(http::HeaderName::from_static("x-api-key"));
            let svc = layer.layer(handler(runs.clone(), 200, 300));
            let scoped = |key| {
                let mut req = keyed(key, "x");
                req.headers_mut()
                    .insert("x-api-key", "sk_live_SECRET".parse().unwrap());
                req
            };
            assert_eq!(
                svc.clone().oneshot(scoped("k")).await.unwrap().status(),
                200
            );
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let again = svc.clone().oneshot(scoped("k")).await.unwrap();
                assert_eq!(again.status(), StatusCode::CONFLICT);
            }
            assert_eq!(runs.load(Ordering::SeqCst), 1);
        })
    });
    assert!(logs.contains("held in flight"), "{logs}");
    assert!(
        !logs.contains("sk_live"),
        "the scope leaked into a log:\n{logs}"
    );
}

/// Found in review: a "keep forever" TTL overflowed the store's clock and freed the key.
#[tokio::test]
async fn a_huge_ttl_or_lease_keeps_the_key() {
    let runs = Arc::new(AtomicU32::new(0));
    let layer = IdempotencyLayer::new(MemoryStore::new())
        .ttl(Duration::MAX)
        .lease(Duration::MAX);
    let svc = layer.layer(handler(runs.clone(), 200, 3));
    assert_eq!(
        svc.clone().oneshot(keyed("t", "x")).await.unwrap().status(),
        200
    );
    let again = svc.oneshot(keyed("t", "x")).await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Found in review: on a runtime without a timer the layer stored a false "unknown outcome"
/// for a handler it never called. Nothing runs; the key is freed; 503.
#[test]
fn a_runtime_without_a_timer_answers_503_and_runs_nothing() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let runs = Arc::new(AtomicU32::new(0));
        let layer = IdempotencyLayer::new(MemoryStore::new());
        let svc = layer.layer(handler(runs.clone(), 200, 3));
        let res = svc.oneshot(keyed("no-timer", "x")).await.unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        assert!(layer.store().is_empty());
    });
}

#[tokio::test]
async fn required_keys_missing_keys_and_large_bodies() {
    let runs = Arc::new(AtomicU32::new(0));
    let layer = IdempotencyLayer::new(MemoryStore::new())
        .require_key_for([Method::POST])
        .max_request_bytes(8);
    let svc = layer.layer(handler(runs.clone(), 200, 1));
    let no_key = Request::post("/v1/messages")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let res = svc.clone().oneshot(no_key).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&body_of(res).await).contains("needs an Idempotency-Key"));
    // A GET without a key passes through untouched.
    let get = Request::get("/v1/messages")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(svc.clone().oneshot(get).await.unwrap().status(), 200);
    let res = svc
        .clone()
        .oneshot(keyed("big-body", "more than 8 bytes"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(layer.store().is_empty());
}

/// The client went away mid-handler (hyper drops the request's future): the handler runs on,
/// repeats get 409 meanwhile, then the stored response.
#[tokio::test(start_paused = true)]
async fn a_dropped_request_runs_to_completion_and_is_stored() {
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let layer = IdempotencyLayer::new(MemoryStore::new());
    let svc = layer.layer(service_fn(move |_req: In| {
        r.fetch_add(1, Ordering::SeqCst);
        async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"sent"))))
        }
    }));
    let pending = tokio::time::timeout(
        Duration::from_millis(50),
        svc.clone().oneshot(keyed("gone", "x")),
    );
    assert!(
        pending.await.is_err(),
        "the request was dropped mid-handler"
    );
    let meanwhile = svc.clone().oneshot(keyed("gone", "x")).await.unwrap();
    assert_eq!(meanwhile.status(), StatusCode::CONFLICT);
    tokio::time::sleep(Duration::from_secs(31)).await;
    let after = svc.oneshot(keyed("gone", "x")).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(after.status(), 200);
    assert_eq!(after.headers()["idempotent-replayed"], "true");
    assert_eq!(body_of(after).await, "sent");
}

/// A handler that panics after it was called: an unknown outcome is kept, the panic goes on
/// to hyper as without the layer.
#[tokio::test]
async fn a_panicking_handler_keeps_an_unknown_outcome() {
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let layer = IdempotencyLayer::new(MemoryStore::new());
    let svc = layer.layer(service_fn(move |_req: In| {
        let n = r.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                panic!("handler bug after the write");
            }
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        }
    }));
    let first = tokio::spawn(svc.clone().oneshot(keyed("p", "x"))).await;
    assert!(first.unwrap_err().is_panic());
    // The entry is stored by a task of its own, right after the panic.
    let mut again = svc.clone().oneshot(keyed("p", "x")).await.unwrap();
    for _ in 0..100 {
        if again.status() != StatusCode::CONFLICT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        again = svc.clone().oneshot(keyed("p", "x")).await.unwrap();
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(again.status(), 500);
    assert_eq!(again.headers()["x-should-retry"], "false");
}

/// Keys in both forms common clients send; `"k"` and `k` are one key.
#[tokio::test]
async fn bare_and_quoted_keys_are_accepted_and_are_one_key() {
    let runs = Arc::new(AtomicU32::new(0));
    let layer = IdempotencyLayer::new(MemoryStore::new());
    let svc = layer.layer(handler(runs.clone(), 200, 3));
    let bare = Request::post("/v1/messages")
        .header("idempotency-key", "abc-123")
        .body(Full::new(Bytes::from_static(b"x")))
        .unwrap();
    assert_eq!(svc.clone().oneshot(bare).await.unwrap().status(), 200);
    let quoted = svc.clone().oneshot(keyed("abc-123", "x")).await.unwrap();
    assert_eq!(quoted.headers()["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_full_store_answers_503_and_runs_nothing() {
    let runs = Arc::new(AtomicU32::new(0));
    let layer = IdempotencyLayer::new(MemoryStore::with_limits(1, 1 << 20));
    let svc = layer.layer(handler(runs.clone(), 200, 1));
    assert_eq!(
        svc.clone()
            .oneshot(keyed("one", "x"))
            .await
            .unwrap()
            .status(),
        200
    );
    let res = svc.clone().oneshot(keyed("two", "x")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["retry-after"], "1");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The client went away, and the handler, now finishing in a task of its own, panics: the
/// task's drop still keeps an "unknown outcome" for the key; a repeat never runs it again.
#[tokio::test(start_paused = true)]
async fn a_detached_handler_that_panics_keeps_an_unknown_outcome() {
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let layer = IdempotencyLayer::new(MemoryStore::new());
    let svc = layer.layer(service_fn(move |_req: In| {
        r.fetch_add(1, Ordering::SeqCst);
        async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            panic!("handler bug after the write, after its client left");
            #[allow(unreachable_code)]
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        }
    }));
    let gone = tokio::time::timeout(
        Duration::from_millis(50),
        svc.clone().oneshot(keyed("dp", "x")),
    );
    assert!(gone.await.is_err(), "the client left mid-handler");
    tokio::time::sleep(Duration::from_secs(6)).await;
    let again = svc.oneshot(keyed("dp", "x")).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(again.status(), 500);
    assert_eq!(again.headers()["x-should-retry"], "false");
}
