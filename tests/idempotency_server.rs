//! `IdempotencyLayer` in process: what is stored, what is freed, what is refused.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};
use tower_retry_safety::server::{Entry, IdempotencyLayer, IdempotencyStore, MemoryStore};

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
async fn every_status_is_stored_and_replayed_byte_for_byte() {
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

#[tokio::test]
async fn an_inner_error_stores_nothing_and_frees_the_key() {
    let layer = IdempotencyLayer::new(MemoryStore::new());
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let svc = layer.layer(service_fn(move |_req: In| {
        let n = c.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                Err::<Response<Full<Bytes>>, BoxError>("backend down".into())
            } else {
                Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
            }
        }
    }));
    assert!(svc.clone().oneshot(keyed("e", "x")).await.is_err());
    assert_eq!(layer.store().get("e").await.unwrap(), None);
    let res = svc.oneshot(keyed("e", "x")).await.unwrap();
    assert_eq!(res.status(), 200);
    assert!(res.headers().get("idempotent-replayed").is_none());
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_response_over_the_limit_passes_through_unstored() {
    let runs = Arc::new(AtomicU32::new(0));
    let layer = IdempotencyLayer::new(MemoryStore::new()).max_response_bytes(100);
    let svc = layer.layer(handler(runs.clone(), 200, 1000));
    let res = svc.clone().oneshot(keyed("big", "x")).await.unwrap();
    assert_eq!(body_of(res).await.len(), 1000, "nothing lost");
    assert_eq!(layer.store().get("big").await.unwrap(), None);
    assert!(layer.store().is_empty());
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

#[tokio::test]
async fn a_dropped_request_frees_its_key() {
    let layer = IdempotencyLayer::new(MemoryStore::new());
    let svc = layer.layer(service_fn(|_req: In| async {
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
    }));
    let pending = tokio::time::timeout(Duration::from_millis(50), svc.oneshot(keyed("gone", "x")));
    assert!(pending.await.is_err());
    assert!(matches!(
        layer.store().get("gone").await.unwrap(),
        None | Some(Entry::InFlight { .. })
    ));
    // The release runs on the runtime right after the drop.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(layer.store().get("gone").await.unwrap(), None);
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
