//! Host-scoped rules and key trust over a tonic `Channel`, against a real tonic server on
//! 127.0.0.1 that counts what each call applies. A generated client sends a path alone
//! (`/lab.v1.Ledger/Put`, no `Host`): the `Channel` adds its endpoint's authority below the
//! layer. Without an origin the layer classifies such a call failing closed; with
//! `RetryPolicy::for_origin` (or a client built `with_origin`) it gets the host-scoped
//! behaviour its user configured. From a new user's report: a host-scoped `NonIdempotent`
//! rule over a proto that calls `Put` IDEMPOTENT was ignored (applied twice 10 of 10), and
//! host-scoped key trust never took effect (40 of 40 keyed writes ended after one attempt).
#![cfg(feature = "tonic")]

use std::time::Duration;

use http::Method;
use retry_safety_testing::grpc::lab::ledger_client::LedgerClient;
use retry_safety_testing::grpc::lab::Entry;
use retry_safety_testing::grpc::stack::{builder, client, Client};
use retry_safety_testing::grpc::{request, serve, Fault};
use tower::ServiceBuilder;
use tower_retry_safety::{Idempotency, MayHaveBeenApplied, RetryPolicyBuilder};

fn entry(id: &str) -> Entry {
    Entry {
        id: id.into(),
        payload: vec![3; 8],
    }
}

/// `Put` is IDEMPOTENT in the proto; a rule scoped to the server's host says it is not. The
/// server applies each call, then answers UNAVAILABLE: a retry would apply it again. Returns
/// the calls applied twice, and the UNAVAILABLEs returned that say "may have been applied".
async fn puts(
    client: &mut Client,
    lab: &retry_safety_testing::grpc::Lab,
    prefix: &str,
) -> (usize, usize) {
    let mut maybe_applied = 0;
    for i in 0..10 {
        let id = format!("{prefix}-{i}");
        let res = client
            .put(request(entry(&id), &id, Some(Fault::UnavailableAfterApply)))
            .await;
        // The fault's UNAVAILABLE, when the call was not retried.
        if let Err(status) = res {
            maybe_applied += usize::from(status.may_have_been_applied());
        }
    }
    (lab.applied_twice(), maybe_applied)
}

fn put_is_a_write_on(host: &str) -> RetryPolicyBuilder {
    builder().route_for_host(
        host,
        Method::POST,
        "/lab.v1.Ledger/Put",
        Idempotency::NonIdempotent,
    )
}

#[tokio::test]
async fn a_host_scoped_write_rule_holds_when_the_call_shows_no_host() {
    let (addr, lab) = serve().await;
    let mut client = client(addr, put_is_a_write_on("127.0.0.1").build().unwrap()).await;
    assert_eq!(puts(&mut client, &lab, "no-origin").await, (0, 10));
    for i in 0..10 {
        assert_eq!(lab.applied(&format!("no-origin-{i}")), 1);
        assert_eq!(lab.attempts(&format!("no-origin-{i}")).len(), 1);
    }
}

/// A write rule scoped to another host holds too when the host is unknown: the call may be
/// for that host (fail closed).
#[tokio::test]
async fn a_write_rule_for_any_host_holds_when_the_call_shows_no_host() {
    let (addr, lab) = serve().await;
    let policy = put_is_a_write_on("ledger.internal").build().unwrap();
    let mut client = client(addr, policy).await;
    assert_eq!(puts(&mut client, &lab, "other-host").await, (0, 10));
}

#[tokio::test]
async fn a_host_scoped_write_rule_holds_with_the_channels_origin() {
    let (addr, lab) = serve().await;
    let policy = put_is_a_write_on("127.0.0.1").build().unwrap();
    let policy = policy.for_origin(&format!("http://{addr}")).unwrap();
    let mut client = client(addr, policy).await;
    assert_eq!(puts(&mut client, &lab, "origin").await, (0, 10));
}

/// The control: the same calls, the same fault, without the write rule. The proto's
/// IDEMPOTENT is believed and every call is applied twice, so the fault really repeats a
/// write when a rule does not hold.
#[tokio::test]
async fn without_the_write_rule_the_same_calls_are_applied_twice() {
    let (addr, lab) = serve().await;
    let mut client = client(addr, builder().build().unwrap()).await;
    assert_eq!(puts(&mut client, &lab, "control").await, (10, 0));
}

/// With the origin, a rule scoped to another host does not apply: the call is for this one.
#[tokio::test]
async fn with_the_origin_a_rule_for_another_host_does_not_apply() {
    let (addr, lab) = serve().await;
    let policy = put_is_a_write_on("ledger.internal").build().unwrap();
    let policy = policy.for_origin(&format!("http://{addr}")).unwrap();
    let mut client = client(addr, policy).await;
    assert_eq!(puts(&mut client, &lab, "elsewhere").await, (10, 0));
}

/// A host-scoped `Idempotent` rule applies with the origin and not without it: `Append` is a
/// write in the proto, and the server applies it before its UNAVAILABLE.
#[tokio::test]
async fn a_host_scoped_read_rule_applies_only_with_the_origin() {
    let (addr, lab) = serve().await;
    let policy = builder()
        .route_for_host(
            "127.0.0.1",
            Method::POST,
            "/lab.v1.Ledger/Append",
            Idempotency::Idempotent,
        )
        .build()
        .unwrap();
    let mut without = client(addr, policy.clone()).await;
    let mut with = client(addr, policy.for_origin(&format!("http://{addr}")).unwrap()).await;
    for i in 0..5 {
        let id = format!("append-blind-{i}");
        let fault = Some(Fault::UnavailableAfterApply);
        let status = without.append(request(entry(&id), &id, fault)).await;
        assert!(status.unwrap_err().may_have_been_applied());
        assert_eq!(lab.attempts(&id).len(), 1, "not retried without the host");
        let id = format!("append-seen-{i}");
        let res = with.append(request(entry(&id), &id, fault)).await;
        assert!(res.is_ok(), "{res:?}");
        assert_eq!(
            lab.attempts(&id).len(),
            2,
            "retried: the rule said idempotent"
        );
    }
}

/// The layer's own error, turned into a `Status`, names the call as gRPC does and says
/// whether it may have been applied; so does a failed status the server answered.
#[tokio::test]
async fn a_status_answers_may_have_been_applied_and_names_the_call() {
    let (addr, lab) = serve().await;
    let policy = builder()
        .attempt_timeout(Duration::from_millis(200))
        .max_retries(0)
        .build()
        .unwrap();
    let mut client = client(addr, policy).await;
    // A write that timed out after apply: the layer's error.
    let id = "slow-write";
    let fault = Some(Fault::SlowAfterApply(Duration::from_secs(5)));
    let status = client
        .append(request(entry(id), id, fault))
        .await
        .unwrap_err();
    assert!(status.may_have_been_applied(), "{status:?}");
    assert!(
        status.message().starts_with("lab.v1.Ledger/Append "),
        "{}",
        status.message()
    );
    assert!(!status.message().contains("POST"), "{}", status.message());
    assert_eq!(lab.applied(id), 1);
    // A call to a port where nothing listens never left: never applied, and the status says so.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let lazy = tonic::transport::Endpoint::from_shared(format!("http://{closed}"))
        .unwrap()
        .connect_lazy();
    let svc = ServiceBuilder::new()
        .map_err(tonic::Status::from as fn(_) -> _)
        .layer(builder().max_retries(0).build().unwrap())
        .service(lazy);
    let status = LedgerClient::new(svc)
        .append(request(entry("refused"), "refused", None))
        .await
        .unwrap_err();
    assert!(!status.may_have_been_applied(), "{status:?}");
    // A status the layer never saw says nothing: maybe applied.
    assert!(tonic::Status::unavailable("from elsewhere").may_have_been_applied());
}
