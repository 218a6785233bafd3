//! What `DeadlineLayer` allocates to read a request's deadline: reading the six conventions
//! costs a request nothing (issue 48, item 7's cost rule).

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tower::{service_fn, Layer, ServiceExt};
use tower_idempotency_keys::deadline::DeadlineLayer;

use crate::allocations;

/// Allocations of one request (answered, its body read) after 20 that warmed the runtime up.
fn per_request(headers: &'static [(&'static str, &'static str)]) -> u64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let svc = DeadlineLayer::new(Duration::from_secs(30)).layer(service_fn(
        |_req: Request<Full<Bytes>>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
        },
    ));
    // The request is built outside the count: only the layer's work is counted.
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

/// issue 48, item 7: a request that names no deadline, one that names ours, and one that
/// names all six conventions' (each well-formed, one attempt header too) allocate the same:
/// the headers are read by lookup, and only a note (a header not used as sent) allocates.
#[test]
fn reading_every_convention_allocates_nothing() {
    let none = per_request(&[]);
    let ours = per_request(&[("request-timeout-ms", "5000")]);
    let all = per_request(&[
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
