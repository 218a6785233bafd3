//! A hedge is counted (and its token and budget spent) when it is handed to the inner service,
//! not when it is wanted: behind tower's `ConcurrencyLimit(1)` the first attempt holds the
//! only permit, the hedge waits for it, and the first attempt's answer ends the request
//! before the hedge can go. hyper-util's client to the fault server on 127.0.0.1, which
//! counts every request it reads per operation.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retry_safety_testing::fault_server::{Fault, FaultServer};
use tower::limit::ConcurrencyLimit;
use tower::{Layer, Service, ServiceExt};
use tower_retry_safety::{Hedge, RetryPolicy, RetryReport};

/// The handler's time after it read a request: ten times the hedge delay.
const HANDLER_MS: &str = "300";

/// `Hedge::fixed(30ms)` over `ConcurrencyLimit(1)`, four GETs each taking 300 ms on the
/// server: every hedge is wanted at 30 ms and never sent (the permit comes back with the
/// first attempt's answer, which ends the request). The reports used to say "1 hedged" for
/// each (4 hedges) while the server read none. Now the hedges reported equal the hedges the
/// server read, exactly: 0 and 0, one request read per operation.
///
/// Issue 41 item 8, fifth review.
#[tokio::test]
async fn hedges_reported_are_the_hedges_the_server_read_behind_a_concurrency_limit() {
    let server = FaultServer::start().await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let policy = RetryPolicy::builder()
        .hedge(Hedge::fixed(Duration::from_millis(30)).max_extra_load(1.0))
        .no_budget()
        .build()
        .unwrap();
    let mut svc = policy.layer(ConcurrencyLimit::new(client, 1));
    // Per operation: (hedges reported, requests the server read).
    let mut seen = Vec::new();
    for i in 0..4 {
        let op = format!("limited-{i}");
        let req = Request::builder()
            .method(Method::GET)
            .uri(server.url(&op))
            .header("x-fault", Fault::None.name())
            .header("x-handler-delay-ms", HANDLER_MS)
            .body(Full::new(Bytes::new()))
            .unwrap();
        let res = svc.ready().await.unwrap().call(req).await.unwrap();
        let report = RetryReport::of(&res).cloned().expect("the layer's report");
        res.into_body().collect().await.unwrap();
        seen.push((report.hedges(), server.stats(&op).attempts));
    }
    assert_eq!(
        seen,
        vec![(0, 1); 4],
        "(hedges reported, requests read) per GET"
    );
}
