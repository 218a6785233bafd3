//! What `DeadlineLayer` allocates: reading the six conventions costs a request nothing
//! (issue 48, item 7's cost rule), and the layer adds only the caller's `Inbound` extension.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_idempotency_keys::deadline::DeadlineLayer;
use tower_retry_safety::deadline::Inbound;

use crate::allocations;

/// Allocations of one request carrying `headers` through `svc` (answered, its body read),
/// after 20 that warmed the runtime up. The request is built outside the count: only the
/// service's work is counted.
fn per_request<S, B>(svc: S, headers: &[(&str, &str)]) -> u64
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>, Error = Infallible> + Clone,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let request = || {
        let mut req = Request::get("/v1/things");
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        req.body(Full::new(Bytes::new())).unwrap()
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

fn layered(headers: &[(&str, &str)]) -> u64 {
    per_request(
        DeadlineLayer::new(Duration::from_secs(30)).layer(handler()),
        headers,
    )
}

/// A request without any deadline header, through the handler alone and through
/// `DeadlineLayer` over it: the layer adds exactly what putting the caller's `Inbound` in the
/// request's extensions costs (hyper hands a server a request with none, so the first insert
/// makes the map) — reading the headers allocates nothing. Found by the adversarial review of
/// issue 48: the docs said "no allocation"; they now say what the insert costs.
#[test]
fn a_request_naming_no_deadline_costs_the_layer_only_its_extension() {
    let bare = per_request(handler(), &[]);
    let layered = layered(&[]);
    let insert = allocations(|| {
        let mut extensions = http::Extensions::new();
        extensions.insert(Inbound::within(Duration::from_secs(30)));
        std::hint::black_box(extensions);
    });
    assert_eq!(
        layered,
        bare + insert,
        "bare handler: {bare}, with DeadlineLayer: {layered}, the extension's insert: {insert}"
    );
}

/// issue 48, item 7: a request that names no deadline, one that names ours, and one that
/// names all six conventions' (each well-formed, one attempt header too) allocate the same:
/// the headers are read by lookup, and only a note (a header not used as sent) allocates.
#[test]
fn reading_every_convention_allocates_nothing() {
    let none = layered(&[]);
    let ours = layered(&[("request-timeout-ms", "5000")]);
    let all = layered(&[
        ("request-timeout-ms", "5000"),
        ("grpc-timeout", "4S"),
        ("connect-timeout-ms", "4000"),
        ("x-envoy-expected-rq-timeout-ms", "4000"),
        ("x-stainless-read-timeout", "3.5"),
        ("x-stainless-timeout", "3"),
        ("x-stainless-retry-count", "0"),
        ("amz-sdk-request", "attempt=1; max=3"),
    ]);
    assert_eq!((ours, all), (none, none), "no deadline: {none} allocations");
}
