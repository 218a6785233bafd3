//! A gRPC call's deadline on a real tonic `Channel` (issue 48): each attempt's
//! `grpc-timeout` is the time the client waits for that attempt, and a call whose caller's
//! deadline has passed ends `DEADLINE_EXCEEDED` — not `UNAVAILABLE`, which gRPC retry
//! policies retry — with nothing sent and nothing applied.
#![cfg(feature = "tonic")]

use std::time::Duration;

use retry_safety_testing::grpc::lab::CountRequest;
use retry_safety_testing::grpc::misbehaving_server::client;
use retry_safety_testing::grpc::{request, serve, Fault};
use tonic::Code;
use tower_retry_safety::deadline::{self, Inbound};
use tower_retry_safety::grpc::{ATTEMPTS_KEY, MAY_HAVE_BEEN_APPLIED_KEY};
use tower_retry_safety::RetryPolicy;

fn grpc_timeout(h: &http::HeaderMap) -> Duration {
    let text = h["grpc-timeout"].to_str().expect("ascii").to_owned();
    let (digits, unit) = text.split_at(text.len() - 1);
    let n: u64 = digits.parse().expect("digits");
    match unit {
        "n" => Duration::from_nanos(n),
        "u" => Duration::from_micros(n),
        "m" => Duration::from_millis(n),
        "S" => Duration::from_secs(n),
        other => panic!("unit {other}"),
    }
}

/// A read whose first attempt is held past its 150 ms attempt timeout, under a 3 s deadline:
/// both attempts carry at most 150 ms. Before: `grpc-timeout: 2999990u`.
#[tokio::test]
async fn each_attempt_carries_the_time_the_client_waits_for_it() {
    let (addr, lab) = serve().await;
    let policy = RetryPolicy::builder()
        .backoff(Duration::from_millis(1), Duration::from_millis(2))
        .deadline(Duration::from_secs(3))
        .attempt_timeout(Duration::from_millis(150))
        .grpc_descriptors(&retry_safety_testing::grpc::descriptor_set())
        .build()
        .expect("policy");
    let mut client = client(addr, policy).await;
    let req = request(
        CountRequest { id: "held".into() },
        "held",
        Some(Fault::SlowAfterApply(Duration::from_secs(10))),
    );
    client.count(req).await.expect("the resend answers");
    let attempts = lab.attempts("held");
    assert_eq!(attempts.len(), 2);
    for h in &attempts {
        let sent = grpc_timeout(h);
        assert!(sent <= Duration::from_millis(150), "{sent:?} on the wire");
    }
}

/// A call made after its caller's deadline passed is not sent: `DEADLINE_EXCEEDED`, 0
/// attempts, not applied. Before: `UNAVAILABLE`.
#[tokio::test]
async fn a_call_refused_at_its_callers_deadline_ends_deadline_exceeded() {
    let (addr, lab) = serve().await;
    let policy = RetryPolicy::builder()
        .grpc_descriptors(&retry_safety_testing::grpc::descriptor_set())
        .build()
        .expect("policy");
    let mut client = client(addr, policy).await;
    let req = request(CountRequest { id: "gone".into() }, "gone", None);
    let gone = Inbound::at(tokio::time::Instant::now());
    let status = deadline::scope(gone, client.count(req))
        .await
        .expect_err("not sent");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(status.metadata().get(ATTEMPTS_KEY).expect("attempts"), "0");
    assert_eq!(
        status
            .metadata()
            .get(MAY_HAVE_BEEN_APPLIED_KEY)
            .expect("applied"),
        "false"
    );
    assert!(lab.attempts("gone").is_empty());
}
