//! The server layer's edge cases, from an adversarial review of its performance rework,
//! checks of what it pins: a completed entry lives for its TTL; one chunk and many chunks are
//! one request (a different query is not); a keyed PUT with a gRPC content type gets HTTP
//! answers (found by review).

use crate::keyed_requests::{keyed, In};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{Either, Full, StreamBody};
use tower::{service_fn, Layer, ServiceExt};
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};

/// A completed entry expires with its TTL: after it the key is free.
#[tokio::test(start_paused = true)]
async fn a_completed_entry_lives_for_its_ttl() {
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let layer = IdempotencyLayer::new(MemoryStore::new()).ttl(Duration::from_secs(10));
    let svc = layer.layer(service_fn(move |_req: In| {
        r.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok")))) }
    }));
    svc.clone().oneshot(keyed("t", "x")).await.unwrap();
    tokio::time::advance(Duration::from_millis(9_990)).await;
    let res = svc.clone().oneshot(keyed("t", "x")).await.unwrap();
    assert_eq!(res.headers()["idempotent-replayed"], "true");
    tokio::time::advance(Duration::from_millis(20)).await;
    let res = svc.clone().oneshot(keyed("t", "x")).await.unwrap();
    assert!(res.headers().get("idempotent-replayed").is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A request body in one chunk and the same in many give one fingerprint (the stored response, not
/// 422); a different query is a 422.
#[tokio::test]
async fn one_chunk_and_many_chunks_are_one_request() {
    let layer = IdempotencyLayer::new(MemoryStore::new());
    let svc = layer.layer(service_fn(|_req: Request<Either<Full<Bytes>, _>>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    }));
    let chunks = |parts: Vec<&'static [u8]>| {
        StreamBody::new(futures_util::stream::iter(
            parts
                .into_iter()
                .map(|p| Ok::<_, Infallible>(Frame::data(Bytes::from_static(p))))
                .collect::<Vec<_>>(),
        ))
    };
    let req = |uri: &str, parts| {
        Request::post(uri)
            .header("idempotency-key", "abc")
            .body(chunks(parts))
            .unwrap()
    };
    let a = svc
        .clone()
        .oneshot(req("/p?x=1", vec![b"hello world"]))
        .await
        .unwrap();
    assert_eq!(a.status(), 200);
    let b = svc
        .clone()
        .oneshot(req("/p?x=1", vec![b"", b"hel", b"", b"lo", b" world"]))
        .await
        .unwrap();
    assert_eq!(b.headers()["idempotent-replayed"], "true");
    let c = svc
        .clone()
        .oneshot(req("/p?x=2", vec![b"hello world"]))
        .await
        .unwrap();
    assert_eq!(c.status(), 422);
}

/// A keyed PUT with a gRPC content type is no gRPC call (gRPC sends POSTs only): a repeat
/// while its handler runs gets the HTTP 409, as the client's layer reads it, not a gRPC
/// status in a 200. Found by review: the server read any method's content type, the client
/// only a POST's, and a PUT's 409 became a 200 the client took as a success.
#[tokio::test(start_paused = true)]
async fn a_keyed_put_with_a_grpc_content_type_gets_http_answers() {
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let layer = IdempotencyLayer::new(MemoryStore::new());
    let svc = layer.layer(service_fn(move |_req: In| {
        r.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"put"))))
        }
    }));
    let grpc_put = || {
        let mut req = keyed("grpc-put", "x");
        *req.method_mut() = http::Method::PUT;
        req.headers_mut()
            .insert("content-type", HeaderValue::from_static("application/grpc"));
        req
    };
    let first = tokio::spawn(svc.clone().oneshot(grpc_put()));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let during = svc.clone().oneshot(grpc_put()).await.unwrap();
    assert_eq!(during.status(), StatusCode::CONFLICT);
    assert!(!during.headers().contains_key("grpc-status"));
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
