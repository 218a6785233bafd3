//! Exactly once across a fleet: two server instances, each with an `IdempotencyLayer` over a
//! `RedisStore` on one Redis, behind a forwarder on loopback that sends an operation's
//! consecutive attempts to different instances. A client that mints idempotency keys sends
//! writes whose first attempt meets a fault (response lost after the write was applied,
//! handler slow after apply — past the client's timeout and the lease, 503 after apply, 429
//! and 500 before apply); side effects are counted across the fleet.
//!
//! Run: `cargo run --example fleet --features redis` (Redis at `REDIS_URL`, by default
//! `redis://127.0.0.1:6379`; keys are written under a fresh prefix).

#[path = "../tests/support/fleet.rs"]
mod fleet;

use std::time::Duration;

use bytes::Bytes;
use fleet::{forwarder, Counts, Fault, Instance};
use http::Request;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{ServiceBuilder, ServiceExt};
use tower_retry_safety::RetryPolicy;

const OPS_PER_FAULT: usize = 10;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    let prefix = format!("trs-fleet-example-{nanos}:");
    let counts = Counts::default();
    let a = Instance::start(&url, &prefix, counts.clone()).await;
    let b = Instance::start(&url, &prefix, counts.clone()).await;
    let front = forwarder(vec![a.addr, b.addr]).await;
    println!(
        "two instances ({}, {}) share {url}; the forwarder is {front}",
        a.addr, b.addr
    );

    let policy = RetryPolicy::builder()
        .mint_idempotency_keys(true)
        .max_retries(10)
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
    println!(
        "{writes} writes across the fleet: {succeeded} succeeded, {} applied in all, {} applied twice",
        counts.total_applied(),
        counts.applied_twice()
    );
    Ok(())
}
