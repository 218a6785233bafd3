//! Host-scoped key trust over a tonic `Channel`, against a real tonic server on 127.0.0.1
//! behind the server's `IdempotencyLayer`: a generated client sends a path alone, so the trust
//! takes effect only with the channel's origin (`RetryPolicy::for_origin`). From a new user's
//! report: host-scoped key trust never took effect (40 of 40 keyed writes ended after one
//! attempt); moved here from the client's tests/grpc/hosts.rs.

use retry_safety_testing::grpc::lab::Entry;
use retry_safety_testing::grpc::stack::{builder, client};
use retry_safety_testing::grpc::{request, serve_keyed, Fault};
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};
use tower_retry_safety::MayHaveBeenApplied;

fn entry(id: &str) -> Entry {
    Entry {
        id: id.into(),
        payload: vec![3; 8],
    }
}

fn keyed(id: &str, fault: Fault) -> tonic::Request<Entry> {
    let mut req = request(entry(id), id, Some(fault));
    req.metadata_mut()
        .insert("idempotency-key", format!("key-{id}").parse().unwrap());
    req
}

/// Keyed writes to a server that honours keys, trust scoped to its host: without the origin
/// each ends after one attempt (the trust cannot apply); with it each is recovered by the
/// server's stored response. Applied once either way.
#[tokio::test]
async fn host_scoped_key_trust_recovers_keyed_writes_with_the_origin() {
    let (addr, lab) = serve_keyed(IdempotencyLayer::new(MemoryStore::new())).await;
    let policy = builder()
        .honor_idempotency_key_for_host("127.0.0.1")
        .build()
        .unwrap();
    let mut without = client(addr, policy.clone()).await;
    let mut with = client(
        addr,
        policy
            .for_origin(&format!("127.0.0.1:{}", addr.port()))
            .unwrap(),
    )
    .await;
    let (mut ended_once, mut recovered) = (0, 0);
    for i in 0..40 {
        let id = format!("blind-{i}");
        if let Err(status) = without
            .append(keyed(&id, Fault::UnavailableAfterApply))
            .await
        {
            assert!(status.may_have_been_applied());
            ended_once += usize::from(lab.attempts(&id).len() == 1);
        }
        let id = format!("seen-{i}");
        let res = with.append(keyed(&id, Fault::UnavailableAfterApply)).await;
        if let Ok(res) = res {
            assert_eq!(res.get_ref().applied, 1);
            recovered += usize::from(lab.attempts(&id).len() == 2);
        }
    }
    assert_eq!((ended_once, recovered), (40, 40));
    assert_eq!(lab.applied_twice(), 0);
}
