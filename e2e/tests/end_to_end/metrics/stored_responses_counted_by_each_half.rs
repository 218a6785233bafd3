//! Keys end to end, counted by both halves: the client's instruments and the server layer's
//! count the same stored responses for the tour's fault mix with minted keys. The client's
//! instruments alone against its reports are the client's tests/metrics/.

use retry_safety_testing::fault_server::FaultServer;
use retry_safety_testing::meters::{fault_mix, fault_mix_policy as policy, Meters};
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};

/// Keys end to end: the client's count of stored responses received equals its reports'
/// `is_stored_response()`, and equals the server layer's count of repeats answered from the stored
/// response; no write is suppressed (the key makes the repeat harmless).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_responses_are_counted_once_by_each_half() {
    let client_meters = Meters::new();
    let server_meters = Meters::new();
    let keys = IdempotencyLayer::new(MemoryStore::new()).meter(server_meters.meter());
    let server = FaultServer::start_with_keys(keys).await;
    let policy = policy()
        .mint_idempotency_keys(true)
        .meter(client_meters.meter())
        .build()
        .expect("policy");
    let reports = fault_mix(policy, &server).await;
    let client = client_meters.read();
    let server = server_meters.read();

    let stored = reports.iter().filter(|r| r.is_stored_response()).count() as u64;
    assert!(
        stored > 0,
        "a keyed write whose first answer was lost gets the stored one"
    );
    assert_eq!(client.total("retry_safety.client.stored_responses"), stored);
    assert_eq!(
        server.sum_where(
            "retry_safety.server.keyed_requests",
            "retry_safety.key.outcome",
            "stored-response"
        ),
        stored
    );
    assert_eq!(client.total("retry_safety.client.writes.suppressed"), 0);
    let stopped_stored: u64 = client
        .u64_histogram_points("retry_safety.client.attempts")
        .iter()
        .filter(|(a, _)| a["retry_safety.stop_reason"] == "stored-response")
        .map(|(_, count)| count)
        .sum();
    assert_eq!(stopped_stored, stored);
}
