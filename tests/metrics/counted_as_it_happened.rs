//! The instruments count what happened on the wire, read back through the SDK's in-memory
//! exporter beside the server's own counts: a write not retried because it may have been
//! applied is a suppressed write whatever `Retry-After` it got, and a hedge is counted when
//! the server can read it, not when it was wanted.

use std::time::Duration;

use super::Meters;
use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retry_safety_testing::fault_server::{Fault, FaultServer};
use retry_safety_testing::raw_server::{cl, head, Act, Raw};
use tower::limit::ConcurrencyLimit;
use tower::{Layer, Service, ServiceExt};
use tower_retry_safety::{Hedge, RetryPolicy, RetryReport, RetrySafetyMiddleware};

/// A POST answered 503 with `Retry-After: 3600`, once through the tower layer and once
/// through the reqwest adapter: each write may have been applied, so it is not retried for
/// that reason first. Both used to be counted in `retries.refused{retry-after-too-long}` and
/// not in `writes.suppressed`. Now: 2 suppressed, 0 refused; the server read 2 writes.
///
/// Issue 41 item 7, fifth review.
#[tokio::test]
async fn a_write_answered_with_a_long_retry_after_is_counted_suppressed_not_refused() {
    let meters = Meters::new();
    let answer = head(
        "503 Service Unavailable",
        &["retry-after: 3600".into(), cl(0)],
    );
    let server = Raw::start(move |_, _| vec![Act::W(answer.clone())]).await;
    let policy = RetryPolicy::builder()
        .no_budget()
        .meter(meters.meter())
        .build()
        .unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = Request::post(server.url("/v1/messages"))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let res = policy.clone().layer(client).oneshot(req).await.unwrap();
    assert_eq!(res.status(), 503);
    let reqwest = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetrySafetyMiddleware::new(policy))
        .build();
    let res = reqwest
        .post(server.url("/v1/messages"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 503);
    let got = meters.read();
    assert_eq!(
        (
            got.total("retry_safety.client.writes.suppressed"),
            got.total("retry_safety.client.retries.refused"),
            server.writes(),
        ),
        (2, 0, 2),
        "(writes suppressed, retries refused, writes the server read)"
    );
}

/// `Hedge::fixed(30ms)` over `ConcurrencyLimit(1)`, four GETs each taking 300 ms on the
/// server: the first attempt holds the only permit until its answer ends the request, so no
/// hedge is ever sent. The hedges counter used to say 4 while the server read none; now it
/// equals the hedges the server read: 0.
///
/// Issue 41 item 8, fifth review.
#[tokio::test]
async fn the_hedges_counter_is_the_hedges_the_server_read_behind_a_concurrency_limit() {
    let meters = Meters::new();
    let server = FaultServer::start().await;
    let policy = RetryPolicy::builder()
        .hedge(Hedge::fixed(Duration::from_millis(30)).max_extra_load(1.0))
        .no_budget()
        .meter(meters.meter())
        .build()
        .unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut svc = policy.layer(ConcurrencyLimit::new(client, 1));
    let (mut reported, mut read) = (0, 0);
    for i in 0..4 {
        let op = format!("limited-{i}");
        let req = Request::builder()
            .method(Method::GET)
            .uri(server.url(&op))
            .header("x-fault", Fault::None.name())
            .header("x-handler-delay-ms", "300")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let res = svc.ready().await.unwrap().call(req).await.unwrap();
        reported += u64::from(RetryReport::of(&res).expect("the report").hedges());
        res.into_body().collect().await.unwrap();
        read += u64::from(server.stats(&op).attempts - 1);
    }
    let counted = meters.read().total("retry_safety.client.hedges");
    assert_eq!(
        (counted, reported, read),
        (0, 0, 0),
        "(hedges counted, hedges reported, hedges the server read)"
    );
}
