//! `RetryPolicy::for_origin` refuses an origin no channel can send to (port 0, an unspecified
//! address), naming the input: a call classified for such an origin is classified for a host
//! it never reaches, so a write rule scoped to the real endpoint does not apply to it. Against
//! the lab's tonic server on 127.0.0.1, which counts what each call applies.
#![cfg(feature = "tonic")]

use std::net::SocketAddr;
use std::time::Duration;

use http::Method;
use retry_safety_testing::grpc::lab::ledger_client::LedgerClient;
use retry_safety_testing::grpc::lab::{Entry, Receipt};
use retry_safety_testing::grpc::{channel, request, serve, Fault};
use tower::ServiceBuilder;
use tower_retry_safety::{Idempotency, MayHaveBeenApplied, RetryPolicy, RetryPolicyBuilder};

fn builder() -> RetryPolicyBuilder {
    RetryPolicy::builder()
        .no_budget()
        .jitter(false)
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .max_retries(2)
        .grpc_descriptors(&retry_safety_testing::grpc::descriptor_set())
}

/// A `Put` (IDEMPOTENT in the proto) through the layer over a `Channel` to `addr`, applied by
/// the server and then answered UNAVAILABLE: a retry applies it again.
async fn put(addr: SocketAddr, policy: RetryPolicy, id: &str) -> Result<Receipt, tonic::Status> {
    let svc = ServiceBuilder::new()
        .map_err(tonic::Status::from as fn(_) -> _)
        .layer(policy)
        .service(channel(addr).await);
    let entry = Entry {
        id: id.into(),
        payload: vec![1; 8],
    };
    LedgerClient::new(svc)
        .put(request(entry, id, Some(Fault::UnavailableAfterApply)))
        .await
        .map(tonic::Response::into_inner)
}

/// A rule scoped to the server's real `127.0.0.1:<port>` calls `Put` a write.
/// `for_origin("http://127.0.0.1:0")` (or `0.0.0.0`/`[::]` on the real port) used to be
/// accepted: the calls were classified for that origin, the rule did not apply, and each
/// `Put` was retried: applied 2 times. Now each origin is refused with an error that names
/// it; the policy without an origin leaves the call's host unknown and the write rule holds
/// (fail closed): applied once.
///
/// Issue 41 item 2, fifth review.
#[tokio::test]
async fn an_origin_no_channel_sends_to_is_refused_and_the_write_rule_holds() {
    let (addr, lab) = serve().await;
    let port = addr.port();
    let base = builder()
        .route_for_host(
            &format!("127.0.0.1:{port}"),
            Method::POST,
            "/lab.v1.Ledger/Put",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    let origins = [
        ("http://127.0.0.1:0".to_owned(), "127.0.0.1:0"),
        ("127.0.0.1:0".to_owned(), "127.0.0.1:0"),
        (format!("http://0.0.0.0:{port}"), "0.0.0.0"),
        (format!("http://[::]:{port}"), "::"),
    ];
    for (i, (origin, named)) in origins.iter().enumerate() {
        let refused = base.for_origin(origin);
        // The client a user builds: with the origin if it was accepted, else without one.
        let policy = refused.as_ref().map_or_else(|_| base.clone(), Clone::clone);
        let id = format!("origin-{i}");
        let res = put(addr, policy, &id).await;
        assert_eq!(
            (lab.applied(&id), lab.attempts(&id).len()),
            (1, 1),
            "{origin}: (applied, attempts)"
        );
        let status = res.expect_err("the server's UNAVAILABLE");
        assert!(status.may_have_been_applied(), "{origin}: {status:?}");
        let err = refused.expect_err(origin);
        assert_eq!(err.setting_name(), "for_origin", "{origin}");
        assert!(err.to_string().contains(named), "{origin}: {err}");
    }
    // The real origin is accepted, and the rule applies to it.
    let real = base.for_origin(&format!("http://{addr}")).unwrap();
    let res = put(addr, real, "real-origin").await;
    assert_eq!(lab.applied("real-origin"), 1);
    let status = res.expect_err("the server's UNAVAILABLE");
    assert!(status.may_have_been_applied(), "{status:?}");
    assert_eq!(lab.applied_twice(), 0);
}

/// A host scope on port 0 names no host a request reaches: a rule scoped to it used to be
/// accepted and never applied. `build()` now refuses it, naming the input.
///
/// Issue 41 item 2, fifth review.
#[test]
fn a_host_scope_on_port_0_is_refused_by_build() {
    let err = builder()
        .route_for_host(
            "127.0.0.1:0",
            Method::POST,
            "/lab.v1.Ledger/Put",
            Idempotency::NonIdempotent,
        )
        .build()
        .expect_err("port 0 is refused");
    assert!(err.to_string().contains("127.0.0.1:0"), "{err}");
}
