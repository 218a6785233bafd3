//! A `host` metadata entry on a tonic call names no host the call goes to: tonic sends
//! metadata as headers, and the `Channel` still sends the call to its endpoint (`:authority`
//! 127.0.0.1). Such a header must neither borrow another host's key trust nor lift a
//! host-scoped write rule for the real host. Against the lab's tonic server on 127.0.0.1,
//! which counts what each call applies and ignores idempotency keys; every count is exact.
#![cfg(feature = "tonic")]

use std::net::SocketAddr;

use http::Method;
use retry_safety_testing::grpc::lab::Entry;
use retry_safety_testing::grpc::{request, serve, Fault, Lab};
use tower_retry_safety::{Idempotency, MayHaveBeenApplied, RetryPolicy, RetryPolicyBuilder};

fn builder() -> RetryPolicyBuilder {
    retry_safety_testing::grpc::stack::builder().no_budget()
}

use retry_safety_testing::grpc::stack::client;

/// Call `id`, applied by the server and then answered UNAVAILABLE (a retry applies it
/// again), carrying `host: <host>` in its metadata.
fn with_host(id: &str, host: &'static str) -> tonic::Request<Entry> {
    let entry = Entry {
        id: id.into(),
        payload: vec![7; 8],
    };
    let mut req = request(entry, id, Some(Fault::UnavailableAfterApply));
    req.metadata_mut()
        .insert("host", host.parse().expect("metadata value"));
    req
}

/// The policy as given, and the same policy told the channel's origin.
fn without_and_with_origin(
    policy: RetryPolicy,
    addr: SocketAddr,
) -> [(&'static str, RetryPolicy); 2] {
    let origin = policy.for_origin(&format!("http://{addr}")).unwrap();
    [("no origin", policy), ("origin", origin)]
}

/// What the server saw of call `id`: how often it applied it, how many attempts reached it,
/// and the `host` header the first attempt carried (proof that the metadata went out).
fn seen(lab: &Lab, id: &str) -> (u32, usize, Option<String>) {
    let attempts = lab.attempts(id);
    let host = attempts
        .first()
        .and_then(|h| h.get("host")?.to_str().ok().map(str::to_owned));
    (lab.applied(id), attempts.len(), host)
}

/// Keys are trusted for `ledger.trusted.example` only; the lab server ignores them. A keyed
/// `Append` (a write in the proto) to 127.0.0.1 carrying `host: ledger.trusted.example` used
/// to borrow that host's trust and was retried: applied 2 times. Now its host is unknown (the
/// header decides nothing over HTTP/2, and disagrees with the origin), the key is not
/// trusted, and the write is applied once, with or without the origin.
///
/// Issue 41 item 1, fifth review.
#[tokio::test]
async fn host_metadata_naming_a_trusted_host_does_not_borrow_its_key_trust() {
    let (addr, lab) = serve().await;
    let policy = builder()
        .honor_idempotency_key_for_host("ledger.trusted.example")
        .build()
        .unwrap();
    for (case, policy) in without_and_with_origin(policy, addr) {
        let mut client = client(addr, policy).await;
        let id = format!("trusted-host-{}", case.replace(' ', "-"));
        let mut req = with_host(&id, "ledger.trusted.example");
        req.metadata_mut()
            .insert("idempotency-key", format!("key-{id}").parse().unwrap());
        let res = client.append(req).await;
        assert_eq!(
            seen(&lab, &id),
            (1, 1, Some("ledger.trusted.example".into())),
            "{case}: (applied, attempts, host header)"
        );
        let status = res.expect_err("the server's UNAVAILABLE");
        assert!(status.may_have_been_applied(), "{case}: {status:?}");
    }
    assert_eq!(lab.applied_twice(), 0);
}

/// `Put` is IDEMPOTENT in the proto; a rule scoped to the server's host, 127.0.0.1, calls it
/// a write. A `Put` carrying `host: elsewhere.example` used to be classified for that host:
/// the rule did not apply, the proto's IDEMPOTENT was believed and the call retried: applied
/// 2 times. Now the host is unknown and the host-scoped write rule holds (fail closed):
/// applied once, with or without the origin.
///
/// Issue 41 item 1, fifth review.
#[tokio::test]
async fn host_metadata_naming_another_host_does_not_lift_a_write_rule_for_the_real_host() {
    let (addr, lab) = serve().await;
    let policy = builder()
        .route_for_host(
            "127.0.0.1",
            Method::POST,
            "/lab.v1.Ledger/Put",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    for (case, policy) in without_and_with_origin(policy, addr) {
        let mut client = client(addr, policy).await;
        let id = format!("other-host-{}", case.replace(' ', "-"));
        let res = client.put(with_host(&id, "elsewhere.example")).await;
        assert_eq!(
            seen(&lab, &id),
            (1, 1, Some("elsewhere.example".into())),
            "{case}: (applied, attempts, host header)"
        );
        let status = res.expect_err("the server's UNAVAILABLE");
        assert!(status.may_have_been_applied(), "{case}: {status:?}");
    }
    assert_eq!(lab.applied_twice(), 0);
}
