//! Minted keys through `RetrySafetyMiddleware` against a fault server behind the server's
//! `IdempotencyLayer`: a write whose response was lost, slow or a 503 after it was applied is
//! resent with the same minted key and answered from the stored response, applied once.
//! Moved here from the client's tests/reqwest/middleware.rs.

use std::time::Duration;

use reqwest_middleware::ClientBuilder;
use retry_safety_testing::fault_server::{Fault, FaultServer};
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};
use tower_retry_safety::{RetryPolicy, RetryReport, RetrySafetyMiddleware};

/// Each fault applied once, answered 200 from the stored response on the second attempt.
#[tokio::test]
async fn minted_keys_make_lost_writes_succeed_exactly_once() {
    let server = FaultServer::start_with_keys(IdempotencyLayer::new(MemoryStore::new())).await;
    let policy = RetryPolicy::builder()
        .max_retries(3)
        .backoff(Duration::from_millis(5), Duration::from_millis(50))
        .no_budget()
        .mint_idempotency_keys(true)
        .build()
        .unwrap();
    // Per attempt: well under the fault server's 800 ms slow response, well over a loaded
    // machine's round trip.
    let reqwest = reqwest::Client::builder()
        .timeout(Duration::from_millis(400))
        .build()
        .unwrap();
    let client = ClientBuilder::new(reqwest)
        .with(RetrySafetyMiddleware::new(policy))
        .build();
    for fault in [
        Fault::DropAfterApply,
        Fault::SlowAfterApply,
        Fault::UnavailableAfterApply,
    ] {
        let op = format!("keyed-{}", fault.name());
        let res = client
            .post(server.url(&op))
            .header("x-fault", fault.name())
            .body("{\"to\":\"a@example.com\"}")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "{op}");
        assert_eq!(res.headers()["idempotent-replayed"], "true", "{op}");
        let report = res.extensions().get::<RetryReport>().unwrap();
        assert_eq!(report.attempts(), 2, "{op}");
        assert!(report.idempotency_key().is_some());
        assert_eq!(server.applied(&op), 1, "{op}");
    }
}
