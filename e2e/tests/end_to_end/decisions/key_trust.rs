//! Trust in idempotency keys through real sockets: a key counts only where the target is
//! trusted to honour it. Against a server that ignores keys, a write that a marker or a route
//! rule calls non-idempotent is not retried on the strength of a minted key; against one that
//! honours them, trust scoped to its host retries it into the stored response. Side effects counted.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use retry_safety_testing::fault_server::{Fault, FaultServer};
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};
use tower_retry_safety::{Idempotency, RetryPolicy, RetryPolicyBuilder};

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

fn builder() -> RetryPolicyBuilder {
    RetryPolicy::builder()
        .mint_idempotency_keys(true)
        .route(Method::POST, "/ops/rule-{n}", Idempotency::NonIdempotent)
        .backoff(Duration::from_millis(5), Duration::from_millis(20))
        .no_budget()
}

/// The response to the first attempt is lost after the write was applied.
fn lost_after_apply(url: String, marked: bool) -> Request<Full<Bytes>> {
    let mut req = Request::post(url)
        .header("x-fault", Fault::DropAfterApply.name())
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    if marked {
        req.extensions_mut().insert(Idempotency::NonIdempotent);
    }
    req
}

async fn send(
    policy: RetryPolicy,
    req: Request<Full<Bytes>>,
) -> Result<http::Response<hyper::body::Incoming>, tower_retry_safety::Error> {
    ServiceBuilder::new()
        .layer(policy)
        .timeout(Duration::from_secs(5))
        .service(client())
        .oneshot(req)
        .await
}

#[tokio::test]
async fn unscoped_trust_never_retries_a_marked_or_ruled_write_against_a_server_ignoring_keys() {
    let server = FaultServer::start().await; // no IdempotencyLayer: keys are ignored
    for (op, marked) in [("marker-1", true), ("rule-1", false)] {
        let err = send(
            builder().build().unwrap(),
            lost_after_apply(server.url(op), marked),
        )
        .await
        .unwrap_err();
        assert!(err.is_ambiguous(), "{op}");
        assert!(err.retry_suppressed(), "{op}");
        assert_eq!(err.attempts(), 1, "{op}");
        assert!(
            err.idempotency_key().is_some(),
            "a key is minted all the same"
        );
        assert_eq!(server.applied(op), 1, "{op}");
    }
    // Trust named for another host does not reach this one, even for a plain POST.
    let other = builder()
        .honor_idempotency_key_for_host("api.other.test")
        .build()
        .unwrap();
    let err = send(other, lost_after_apply(server.url("plain-1"), false))
        .await
        .unwrap_err();
    assert!(err.retry_suppressed());
    assert_eq!(server.applied("plain-1"), 1);
    // Control: unscoped trust retries a plain keyed POST, which this server applies again.
    // (That is what trust means; it proves the first attempt really applied.)
    let err_or_res = send(
        builder().build().unwrap(),
        lost_after_apply(server.url("plain-2"), false),
    )
    .await;
    assert_eq!(err_or_res.unwrap().status(), StatusCode::OK);
    assert_eq!(server.applied("plain-2"), 2);
}

/// A route known to ignore keys is never retried on one, though its host is trusted.
#[tokio::test]
async fn a_route_that_ignores_keys_outranks_host_trust() {
    let server = FaultServer::start().await;
    let policy = builder()
        .honor_idempotency_key_for_host("127.0.0.1")
        .route_honors_idempotency_key(Method::POST, "/ops/legacy-{n}", false)
        .build()
        .unwrap();
    let err = send(policy, lost_after_apply(server.url("legacy-1"), false))
        .await
        .unwrap_err();
    assert!(err.retry_suppressed());
    assert_eq!(err.attempts(), 1);
    assert_eq!(server.applied("legacy-1"), 1);
}

#[tokio::test]
async fn host_trust_retries_a_marked_write_into_the_servers_stored_response() {
    let server = FaultServer::start_with_keys(IdempotencyLayer::new(MemoryStore::new())).await;
    let policy = builder()
        .honor_idempotency_key_for_host("127.0.0.1")
        .build()
        .unwrap();
    for (op, marked) in [("marker-2", true), ("rule-2", false)] {
        let res = send(policy.clone(), lost_after_apply(server.url(op), marked))
            .await
            .unwrap_or_else(|e| panic!("{op}: {e}"));
        assert_eq!(res.status(), StatusCode::OK, "{op}");
        assert_eq!(res.headers()["idempotent-replayed"], "true", "{op}");
        assert_eq!(server.applied(op), 1, "{op}");
    }
}
