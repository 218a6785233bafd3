//! Keys on a Redis Cluster: `RedisStore::cluster` over a 3-primary cluster (one replica each)
//! started on free loopback ports. Each key's claim, record and fencing are one Redis key, in
//! one hash slot; calls are routed by slot and wait for the key's own replica; a coordinated
//! failover of a shard (`CLUSTER FAILOVER`) is followed by the client (`MOVED`, slot refresh).
#![cfg(feature = "redis")]

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::fleet::{Counts, Fault, Instance};
use crate::support::redis::{wait_until, Cluster};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower_retry_safety::server::RedisStore;

const LIMIT: Duration = Duration::from_secs(60);
const KEYS: usize = 24;

/// Sends a keyed request until it is answered other than 503 (a store call that met a
/// connection closed by a failover); returns the status and whether it was a stored response.
async fn send(to: SocketAddr, op: &str, key: &str) -> (StatusCode, bool) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let start = std::time::Instant::now();
    loop {
        let req = Request::post(format!("http://{to}/{op}"))
            .header("idempotency-key", key)
            .header("x-fault", Fault::None.name())
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let res = client.request(req).await.expect("the instance answers");
        if res.status() != StatusCode::SERVICE_UNAVAILABLE {
            return (
                res.status(),
                res.headers().contains_key("idempotent-replayed"),
            );
        }
        assert!(start.elapsed() < LIMIT, "503 for {LIMIT:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_runs_each_key_once_across_slots_and_a_shard_failover() {
    let cluster = tokio::task::block_in_place(|| Cluster::start(3, 1));
    let seed = cluster.urls()[..1].to_vec();
    let store = RedisStore::cluster(&seed).connect().await.unwrap();
    assert_eq!(
        store.replicas_waited_for(),
        1,
        "one replica per primary found"
    );
    drop(store);

    let counts = Counts::default();
    let a = Instance::start_with(
        move || async move { RedisStore::cluster(&seed).connect().await },
        "cluster:",
        Duration::from_secs(5),
        counts.clone(),
    )
    .await;

    // Keys across the slots (and so the primaries): each runs once, then is replayed.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..KEYS {
        let addr = a.addr;
        tasks.spawn(async move { send(addr, &format!("op-{i}"), &format!("key-{i}")).await });
    }
    while let Some(answer) = tasks.join_next().await {
        assert_eq!(answer.unwrap(), (StatusCode::OK, false));
    }
    // One key, 32 requests at once: one runs, the others get 409 or the stored response.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..32 {
        let addr = a.addr;
        tasks.spawn(async move { send(addr, "same", "same-key").await });
    }
    while let Some(answer) = tasks.join_next().await {
        let (status, _) = answer.unwrap();
        assert!(
            status == StatusCode::OK || status == StatusCode::CONFLICT,
            "{status}"
        );
    }
    assert_eq!(counts.applied("same"), 1);

    // A coordinated failover of every shard: each replica takes over its primary's slots.
    let replicas: Vec<_> = cluster
        .nodes
        .iter()
        .filter(|n| n.replication("role").as_deref() == Some("slave"))
        .collect();
    assert_eq!(replicas.len(), 3);
    for node in &replicas {
        let _: String = node
            .query(redis::cmd("CLUSTER").arg("FAILOVER"))
            .expect("CLUSTER FAILOVER");
    }
    tokio::task::block_in_place(|| {
        wait_until("the replicas to take over", LIMIT, || {
            replicas
                .iter()
                .all(|n| n.replication("role").as_deref() == Some("master"))
                && cluster.nodes.iter().all(|n| {
                    n.query::<String>(redis::cmd("CLUSTER").arg("INFO"))
                        .is_ok_and(|i| i.contains("cluster_state:ok"))
                })
                && cluster
                    .nodes
                    .iter()
                    .filter(|n| n.replication("role").as_deref() == Some("master"))
                    .all(|n| n.replication("connected_slaves").as_deref() == Some("1"))
        })
    });

    // Every key's record is on the new primaries: replayed, never run again.
    for i in 0..KEYS {
        let answer = send(a.addr, &format!("op-{i}"), &format!("key-{i}")).await;
        assert_eq!(answer, (StatusCode::OK, true), "key-{i}");
        assert_eq!(counts.applied(&format!("op-{i}")), 1, "key-{i}");
    }
    let answer = send(a.addr, "same", "same-key").await;
    assert_eq!(answer, (StatusCode::OK, true));
    assert_eq!(counts.applied("same"), 1);
    // New keys are claimed on the new primaries.
    assert_eq!(
        send(a.addr, "after", "after-key").await,
        (StatusCode::OK, false)
    );
    assert_eq!(counts.total_applied(), KEYS as u32 + 2);
}
