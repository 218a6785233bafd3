//! What the instruments say beside what reached the server (issue 41, the adversarial review
//! of items 1–10): a request never sent counts no attempt and no refused retry, and host
//! spellings past the kept attribute sets stay one `server.address` per host.

use std::collections::BTreeSet;
use std::time::Duration;

use http::Method;
use http_body_util::BodyExt;
use tower::{Layer, ServiceExt};
use tower_retry_safety::deadline::{self, Inbound};
use tower_retry_safety::RetryPolicy;

use super::support::fault_server::{Fault, FaultServer};
use super::{client, request, Meters};

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

/// More spellings of one host than the kept sets (16), then another host: one value per
/// host, however many spellings came first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spellings_past_the_kept_sets_stay_one_server_address() {
    let server = FaultServer::start().await;
    let port = server.addr().port();
    let meters = Meters::new();
    let policy = RetryPolicy::builder()
        .meter(meters.meter())
        .no_budget()
        .build()
        .expect("policy");
    let svc = policy.layer(client());
    let spellings = [
        "127.0.0.1",
        "127.1",
        "0x7f.0.0.1",
        "2130706433",
        "0177.0.0.1",
        "127.0.0.01",
        "127.000.000.001",
        "0x7F.1",
        "127.0.0.1.",
        "0x7f000001",
        "017700000001",
        "127.0.1",
        "0x7f.0x0.0x0.0x1",
        "127.0x0.0.1",
        "0x7f.1.",
        "127.00.0.1",
        "127.0.00.1",
        "127.0.0.001",
        "0x07f.1",
        "0x0000007f.1",
        "localhost",
    ];
    for (i, host) in spellings.iter().enumerate() {
        let url = format!("http://{host}:{port}/ops/spelling-{i}");
        // A spelling the resolver refuses ends not sent; it is counted all the same.
        if let Ok(res) = svc
            .clone()
            .oneshot(request(Method::GET, &url, Fault::None))
            .await
        {
            let _ = res.into_body().collect().await;
        }
    }
    let got = meters.read();
    let hosts: BTreeSet<String> = got
        .u64_histogram_points("retry_safety.client.attempts")
        .iter()
        .map(|(a, _)| a.get("server.address").cloned().unwrap_or_default())
        .collect();
    assert_eq!(
        hosts,
        BTreeSet::from(["127.0.0.1".to_owned(), "localhost".to_owned()])
    );
}
