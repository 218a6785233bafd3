//! The server layer hands the handler the request's key (`RequestKey`), in lease mode over any
//! store too; keys derived from it are stable per (scope, key, label) and distinct otherwise.

use std::convert::Infallible;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Either, Full};
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer, RequestKey};

type Req = Request<Either<Full<Bytes>, Full<Bytes>>>;

/// Answers with the key it was handed and the child key for `charge`.
async fn handler(req: Req) -> Result<http::Response<Full<Bytes>>, Infallible> {
    let text = match req.extensions().get::<RequestKey>() {
        Some(key) => format!("{} {}", key.as_str(), key.derive("charge")),
        None => "none".to_owned(),
    };
    Ok(http::Response::new(Full::new(Bytes::from(text))))
}

async fn send(
    svc: &(impl tower::Service<
        http::Request<Full<Bytes>>,
        Response = http::Response<tower_idempotency_keys::future::ResponseBody<Full<Bytes>>>,
        Error = Infallible,
    > + Clone),
    key: Option<&str>,
    tenant: &str,
) -> String {
    let mut req = Request::post("/v1/charges").header("x-tenant", tenant);
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    let res = svc
        .clone()
        .oneshot(req.body(Full::new(Bytes::from("5"))).unwrap())
        .await
        .unwrap();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

#[tokio::test]
async fn the_handler_gets_the_key_and_scoped_stable_derived_keys() {
    let layer = IdempotencyLayer::new(MemoryStore::new())
        .scope_keys_by_header(http::HeaderName::from_static("x-tenant"));
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(handler));
    assert_eq!(send(&svc, None, "a").await, "none");
    let a = send(&svc, Some("\"k-1\""), "a").await;
    let (key, child) = a.split_once(' ').unwrap();
    assert_eq!(key, "k-1", "the key as the client sent it, without quotes");
    assert!(child.starts_with("d1-") && child.len() == 67, "{child}");
    // Another tenant with the same key: its own run, another derived key.
    let b = send(&svc, Some("k-1"), "b").await;
    assert_ne!(a, b);
    // A second server (another store, as after a restart) derives the same key.
    let again = ServiceBuilder::new()
        .layer(
            IdempotencyLayer::new(MemoryStore::new())
                .scope_keys_by_header(http::HeaderName::from_static("x-tenant")),
        )
        .service(service_fn(handler));
    assert_eq!(send(&again, Some("k-1"), "a").await, a);
}
