//! A generated client built `with_origin` puts an authority in every call's URI, and tonic's
//! `Channel` replaces it with its endpoint's: the layer must not read a host from it (issue 41,
//! the adversarial review of items 1–10). Against the lab's tonic server on 127.0.0.1, which
//! ignores keys and counts what it applies. Before: each call applied twice, the caller told Ok.

use std::net::SocketAddr;

use http::Method;
use retry_safety_testing::grpc::lab::ledger_client::LedgerClient;
use retry_safety_testing::grpc::lab::Entry;
use retry_safety_testing::grpc::{request, serve, Fault};
use tower_retry_safety::{Idempotency, RetryPolicy, RetryPolicyBuilder};

fn builder() -> RetryPolicyBuilder {
    retry_safety_testing::grpc::stack::builder().no_budget()
}

/// The layer between the generated client and a `Channel` to `addr`, the client built with
/// `with_origin(origin)`.
async fn client(
    addr: SocketAddr,
    policy: RetryPolicy,
    origin: &str,
) -> LedgerClient<retry_safety_testing::grpc::stack::Layered> {
    let svc = retry_safety_testing::grpc::stack::layered(addr, policy).await;
    LedgerClient::with_origin(svc, origin.parse().expect("origin"))
}

fn entry(id: &str) -> Entry {
    Entry {
        id: id.into(),
        payload: vec![7; 8],
    }
}

/// Keys trusted for `ledger.trusted.example` only; the client's origin names that host, the
/// channel sends to 127.0.0.1. A keyed `Append` answered UNAVAILABLE after apply is applied
/// once, with and without the policy's origin.
#[tokio::test]
async fn with_origin_naming_a_trusted_host_does_not_borrow_its_key_trust() {
    let (addr, lab) = serve().await;
    let policy = builder()
        .honor_idempotency_key_for_host("ledger.trusted.example")
        .build()
        .expect("policy");
    let origin_policy = policy
        .for_origin(&format!("http://{addr}"))
        .expect("origin");
    let mut seen = Vec::new();
    for (case, policy) in [("no origin", policy), ("origin", origin_policy)] {
        let mut client = client(addr, policy, "http://ledger.trusted.example").await;
        let id = format!("with-origin-trusted-{}", case.replace(' ', "-"));
        let mut req = request(entry(&id), &id, Some(Fault::UnavailableAfterApply));
        req.metadata_mut().insert(
            "idempotency-key",
            format!("key-{id}").parse().expect("metadata"),
        );
        let res = client.append(req).await;
        seen.push((case, lab.applied(&id), lab.attempts(&id).len(), res.is_ok()));
    }
    // (case, applied, attempts, caller got Ok)
    assert_eq!(seen, [("no origin", 1, 1, false), ("origin", 1, 1, false)]);
}

/// `Put` is IDEMPOTENT in the proto; a rule scoped to the real host, 127.0.0.1, calls it a
/// write. A client built `with_origin("http://elsewhere.example")` still reaches 127.0.0.1:
/// the rule holds.
#[tokio::test]
async fn with_origin_naming_another_host_does_not_lift_a_write_rule_for_the_real_host() {
    let (addr, lab) = serve().await;
    let policy = builder()
        .route_for_host(
            "127.0.0.1",
            Method::POST,
            "/lab.v1.Ledger/Put",
            Idempotency::NonIdempotent,
        )
        .build()
        .expect("policy");
    let origin_policy = policy
        .for_origin(&format!("http://{addr}"))
        .expect("origin");
    let mut seen = Vec::new();
    for (case, policy) in [("no origin", policy), ("origin", origin_policy)] {
        let mut client = client(addr, policy, "http://elsewhere.example").await;
        let id = format!("with-origin-other-{}", case.replace(' ', "-"));
        let res = client
            .put(request(entry(&id), &id, Some(Fault::UnavailableAfterApply)))
            .await;
        seen.push((case, lab.applied(&id), lab.attempts(&id).len(), res.is_ok()));
    }
    // (case, applied, attempts, caller got Ok)
    assert_eq!(seen, [("no origin", 1, 1, false), ("origin", 1, 1, false)]);
}
