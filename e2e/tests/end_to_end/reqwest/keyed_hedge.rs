//! A keyed write hedged by opt-in through the reqwest-middleware adapter, against the fault
//! server behind the server's `IdempotencyLayer`. The adapter's other hedging tests are the
//! client's tests/reqwest/hedging.rs.

use std::time::Duration;

use http::StatusCode;
use reqwest_middleware::ClientBuilder;
use retry_safety_testing::fault_server::FaultServer;
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};
use tower_retry_safety::{Hedge, RetryPolicy, RetryReport, RetrySafetyMiddleware};

/// A keyed write hedged by opt-in: the hedge gets 409 while the first runs, waits for it,
/// and the write is applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_write_hedged_by_opt_in_is_applied_once() {
    let server = FaultServer::start_with_keys(IdempotencyLayer::new(MemoryStore::new())).await;
    let policy = RetryPolicy::builder()
        .honor_idempotency_key_for_host("127.0.0.1")
        .hedge(
            Hedge::fixed(Duration::from_millis(5))
                .max_extra_load(1.0)
                .keyed_writes(true),
        )
        .no_budget()
        .build()
        .unwrap();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetrySafetyMiddleware::new(policy))
        .build();
    let res = client
        .post(server.url("charge"))
        .header("x-handler-delay-ms", "100")
        .header("idempotency-key", "\"charge-1\"")
        .body("{\"amount\":1}")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let r = RetryReport::of_reqwest(&res).unwrap();
    assert_eq!((r.hedges(), r.won_by()), (1, Some(1)));
    let statuses: Vec<_> = r.attempt_outcomes().map(|a| a.status()).collect();
    assert_eq!(statuses, [Some(StatusCode::CONFLICT), Some(StatusCode::OK)]);
    assert_eq!(server.stats("charge").attempts, 2);
    assert_eq!(server.applied("charge"), 1);
}
