//! What `DeadlineLayer` adds to a request that names no deadline: the module docs say such a
//! request "pays a few lookups and no allocation".
//!
//! Found by the adversarial review of issue 48.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_idempotency_keys::deadline::DeadlineLayer;

use crate::allocations;

/// Allocations of one request (answered, its body read) after 20 that warmed the runtime up.
fn per_request<S, B>(svc: S) -> u64
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>, Error = Infallible> + Clone,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // As hyper hands a request over: no extensions.
    let request = || {
        Request::get("/v1/things")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let send = |req| {
        let svc = svc.clone();
        async move {
            let res = svc.oneshot(req).await.unwrap();
            res.into_body().collect().await.unwrap().to_bytes()
        }
    };
    for _ in 0..20 {
        rt.block_on(send(request()));
    }
    let req = request();
    allocations(|| {
        std::hint::black_box(rt.block_on(send(req)));
    })
}

fn handler(
) -> impl Service<Request<Full<Bytes>>, Response = Response<Full<Bytes>>, Error = Infallible> + Clone
{
    service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
    })
}

/// A request without any deadline header, through the handler alone and through
/// `DeadlineLayer` over it. Expected (the docs' claim): the same allocations. Found: the
/// layer adds some — it always inserts an `Inbound` (the server's maximum) into the request's
/// extensions, and `http::Extensions` allocates its map on the first insert (hyper hands a
/// server a request with none). Either the docs should say "one extension insert", or the
/// no-deadline path should carry the maximum without the map (the task-local alone).
#[test]
fn a_request_naming_no_deadline_costs_the_layer_no_allocation() {
    let bare = per_request(handler());
    let layered = per_request(DeadlineLayer::new(Duration::from_secs(30)).layer(handler()));
    assert_eq!(
        layered, bare,
        "bare handler: {bare}, with DeadlineLayer: {layered}"
    );
}
