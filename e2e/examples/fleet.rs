//! Exactly once across a fleet: two server instances, each with an `IdempotencyLayer` over a
//! `RedisStore` on one Redis, behind a forwarder on loopback that sends an operation's
//! consecutive attempts to different instances. A client that mints idempotency keys sends
//! writes whose first attempt meets a fault (response lost after the write was applied,
//! handler slow after apply — past the client's timeout and the lease, 503 after apply, 429
//! and 500 before apply); side effects are counted across the fleet.
//!
//! Run: `cargo run --example fleet` (Redis at `REDIS_URL`, by default
//! `redis://127.0.0.1:6379`; keys are written under a fresh prefix).
//!
//! With a failover in the middle: `cargo run --example fleet -- --failover`
//! starts a primary with two replicas and a Sentinel of its own (`redis-server` on free
//! loopback ports, stopped at the end); the instances reach the primary through the Sentinel
//! and wait for one replica (found at connect), with a 10 s lease (longer than the failover),
//! and the primary is killed once 20 writes have been applied. Writes meanwhile get 503 and are retried; none is applied twice.

use retry_safety_testing::fleet;
use retry_safety_testing::redis as harness;

use std::time::Duration;

use bytes::Bytes;
use fleet::{forwarder, Counts, Fault, Instance};
use harness::{wait_replicated, Node};
use http::Request;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::task::JoinHandle;
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency_keys::stores::RedisStore;
use tower_retry_safety::RetryPolicy;

const OPS_PER_FAULT: usize = 10;

/// The example's own Redis for `--failover`: a primary, two replicas and a Sentinel.
type Topology = (Node, [Node; 2], Node);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let failover = std::env::args().any(|a| a == "--failover");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    let prefix = format!("trs-fleet-example-{nanos}:");
    let counts = Counts::default();
    let (a, b, topology) = if failover {
        let (a, b, topology) = behind_a_sentinel(&prefix, &counts).await;
        (a, b, Some(topology))
    } else {
        let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
        let a = Instance::start(&url, &prefix, counts.clone()).await;
        let b = Instance::start(&url, &prefix, counts.clone()).await;
        println!("two instances ({}, {}) share {url}", a.addr, b.addr);
        (a, b, None)
    };
    let front = forwarder(vec![a.addr, b.addr]).await;
    println!("the forwarder is {front}");
    let killed = topology.map(|topology| kill_the_primary_after_20_writes(topology, &counts));
    let (writes, succeeded) = send_writes(&front.to_string(), failover).await?;
    println!(
        "{writes} writes across the fleet: {succeeded} succeeded, {} applied in all, {} applied twice",
        counts.total_applied(),
        counts.applied_twice()
    );
    if let Some(killed) = killed {
        drop(killed.await?);
    } else {
        delete_keys(&prefix).await?;
    }
    Ok(())
}

/// Two instances that reach a primary (with two replicas) of the example's own through a
/// Sentinel.
async fn behind_a_sentinel(prefix: &str, counts: &Counts) -> (Instance, Instance, Topology) {
    let primary = Node::primary();
    let replicas = [
        Node::replica_of(primary.port),
        Node::replica_of(primary.port),
    ];
    for replica in &replicas {
        tokio::task::block_in_place(|| wait_replicated(&primary, replica));
    }
    let sentinel = Node::sentinel("fleet", primary.port);
    let through = sentinel.url();
    let start = |counts: Counts| {
        let through = through.clone();
        Instance::start_with(
            move || async move { RedisStore::sentinel([through], "fleet").connect().await },
            prefix,
            // Longer than a failover takes, so that a claim whose owner is cut off from the
            // store meanwhile is still held when it reaches the new primary.
            Duration::from_secs(10),
            counts,
        )
    };
    let (a, b) = (start(counts.clone()).await, start(counts.clone()).await);
    println!(
        "two instances ({}, {}) reach the primary (port {}, two replicas) through a Sentinel (port {})",
        a.addr, b.addr, primary.port, sentinel.port
    );
    (a, b, (primary, replicas, sentinel))
}

/// The primary dies once 20 writes have been applied: the Sentinel promotes a replica. The
/// task gives the topology back, kept until the run ends.
fn kill_the_primary_after_20_writes(
    (mut primary, replicas, sentinel): Topology,
    counts: &Counts,
) -> JoinHandle<Topology> {
    let counts = counts.clone();
    tokio::spawn(async move {
        while counts.total_applied() < 20 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        primary.kill();
        println!(
            "killed the primary after {} writes were applied",
            counts.total_applied()
        );
        (primary, replicas, sentinel)
    })
}

/// Every recoverable fault's writes through a client that mints keys: how many were sent,
/// and how many succeeded.
async fn send_writes(
    front: &str,
    failover: bool,
) -> Result<(usize, usize), Box<dyn std::error::Error>> {
    let policy = RetryPolicy::builder()
        .mint_idempotency_keys(true)
        // Enough to outlast a failover: a 503 asks for a second, a 409 too.
        .max_retries(if failover { 30 } else { 10 })
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        .no_budget()
        .build()?;
    let svc = ServiceBuilder::new()
        .layer(policy)
        .timeout(Duration::from_millis(400))
        .service(Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>());
    let mut tasks = tokio::task::JoinSet::new();
    for fault in Fault::RECOVERABLE {
        for i in 0..OPS_PER_FAULT {
            let (svc, op) = (svc.clone(), format!("{}-{i}", fault.name()));
            let req = Request::post(format!("http://{front}/{op}"))
                .header("x-fault", fault.name())
                .body(Full::new(Bytes::from_static(b"{\"to\":\"a@example.com\"}")))?;
            tasks.spawn(async move { svc.oneshot(req).await.map(|r| r.status()) });
        }
    }
    let (mut writes, mut succeeded) = (0, 0);
    while let Some(done) = tasks.join_next().await {
        writes += 1;
        if matches!(done?, Ok(status) if status.is_success()) {
            succeeded += 1;
        }
    }
    Ok((writes, succeeded))
}

/// The shared Redis keeps nothing of the run: its keys are under a prefix of its own.
async fn delete_keys(prefix: &str) -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let mut con = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut con)
        .await?;
    for chunk in keys.chunks(500) {
        let () = redis::cmd("DEL").arg(chunk).query_async(&mut con).await?;
    }
    Ok(())
}
