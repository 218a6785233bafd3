//! What the instruments say beside what reached the server (issue 41, the adversarial review
//! of items 1–10): a request never sent counts no attempt and no refused retry.

use std::time::Duration;

use http::Method;
use tower::{Layer, ServiceExt};
use tower_retry_safety::deadline::{self, Inbound};
use tower_retry_safety::RetryPolicy;

use super::{client, request, Meters};
use retry_safety_testing::fault_server::{Fault, FaultServer};

/// A GET whose inherited (caller's) deadline has already passed is not sent. Before: the
/// attempts histogram summed 1 and `retries.refused` counted 1; the server read nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_never_sent_for_its_callers_deadline_counts_no_attempt_and_no_refusal() {
    let server = FaultServer::start().await;
    let meters = Meters::new();
    let policy = RetryPolicy::builder()
        .meter(meters.meter())
        .no_budget()
        .build()
        .expect("policy");
    let svc = policy.layer(client());
    let req = request(Method::GET, &server.url("caller-gone"), Fault::None);
    let gone = Inbound::at(tokio::time::Instant::now() - Duration::from_secs(1));
    let res = deadline::scope(gone, svc.oneshot(req)).await;
    let err = res.expect_err("not sent");
    assert_eq!(err.report().map(|r| r.attempts()), Some(0), "{err}");
    assert!(!err.may_have_been_applied(), "{err}");
    let got = meters.read();
    assert_eq!(
        (
            server.stats("caller-gone").attempts,
            got.u64_histogram("retry_safety.client.attempts"),
            got.total("retry_safety.client.retries.refused"),
        ),
        (0, (1, 0), 0),
        "(attempts the server read, attempts histogram (count, sum), retries refused)"
    );
}
