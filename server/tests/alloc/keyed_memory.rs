//! What a keyed request through `IdempotencyLayer` over `MemoryStore` allocates beyond the
//! handler's own: the server bench's `idem_memory` row in process, counted exactly.

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tower::{service_fn, Layer, ServiceExt};
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};

use crate::allocations;

/// The bench's handler: read the body, answer.
async fn handler<B: http_body::Body>(req: Request<B>) -> Result<Response<Full<Bytes>>, Infallible>
where
    B::Error: std::fmt::Debug,
{
    let body = req.into_body().collect().await.unwrap().to_bytes();
    std::hint::black_box(body);
    Ok(Response::new(Full::new(Bytes::from_static(
        b"{\"id\":\"msg_1\"}",
    ))))
}

/// The bench's request, with its own key.
fn keyed_post(n: u64) -> Request<Full<Bytes>> {
    Request::post("/v1/messages")
        .header("idempotency-key", format!("\"bench-{n}\""))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            b"{\"to\":\"a@example.com\",\"text\":\"hi\"}",
        )))
        .unwrap()
}

/// The allocations of one request (made and answered, its response body read) after 20 that
/// warmed the store, the runtime and the layer's renewals up. The 21st key fits the store's
/// table as it is after 20 (no growth), so the count is the same on every run.
fn per_request<F>(rt: &tokio::runtime::Runtime, mut send: impl FnMut(u64) -> F) -> u64
where
    F: std::future::Future<Output = Response<Bytes>>,
{
    for n in 0..20 {
        rt.block_on(send(n));
    }
    let traced = std::env::var_os("ALLOC_TRACE").is_some();
    allocations(|| {
        let hook: fn(usize) = retry_safety_testing::alloc::trace;
        retry_safety_testing::alloc::on_allocation(traced.then_some(hook));
        std::hint::black_box(rt.block_on(send(20)));
        retry_safety_testing::alloc::on_allocation(None);
    })
}

/// Pinned at 8 beyond the handler's (9 against 17, the same 8 as the server bench's 37
/// against 29), traced with `ALLOC_TRACE=1`:
///
/// - the key, parsed from its header into an `Arc<str>` (`key_of`), shared by the claim, the
///   renewals and the handler's `RequestKey`;
/// - the keyed call's box (`IdempotencyService::call`: its type is erased), and the box of
///   its run once claimed (`DetachOnDrop`: moved onto the runtime if the request goes away);
/// - the store's copy of the key (`MemoryStore`'s map owns its keys);
/// - `RequestKey` in the request's extensions: three (`http::Extensions` boxes its map, the
///   map's table and the value);
/// - the store's own copy of the response body (`StoredResponse::with_own_body`: a slice of a
///   larger buffer would otherwise keep all of it alive).
#[test]
fn a_keyed_request_over_memory_allocates_eight_beyond_the_handlers() {
    // The server bench's runtime: one thread (its timer serves the layer's renewals).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let bare = per_request(&rt, |n| async move {
        let res = service_fn(handler).oneshot(keyed_post(n)).await.unwrap();
        let (parts, body) = res.into_parts();
        Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
    });
    let layer = IdempotencyLayer::new(MemoryStore::with_limits(1 << 20, 1 << 30));
    let keyed = per_request(&rt, |n| {
        let svc = layer.layer(service_fn(handler));
        async move {
            let res = svc.oneshot(keyed_post(n)).await.unwrap();
            let (parts, body) = res.into_parts();
            Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
        }
    });
    eprintln!("allocations per request: bare {bare}, keyed over MemoryStore {keyed}");
    assert_eq!((bare, keyed), (9, 17));
}
