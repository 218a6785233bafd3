//! What the client was given is the answer that completed last, whichever attempt began last:
//! a hedged read that got its 2xx from an earlier hedge is recovered.

use std::net::{Ipv4Addr, SocketAddr};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retry_safety_lab::{Fault, Proxy, ProxyConfig, ProxyReport, RouteCounts};
use tokio::task::JoinSet;

use crate::raw_upstream::{RawUpstream, Then, GUARD};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedged_read_answered_by_an_earlier_hedge_is_recovered() {
    // The first attempt is answered by the upstream and held by the proxy; the two hedges
    // are held by the upstream until the test lets the first of them go.
    let upstream = RawUpstream::start(vec![
        Then::Reply("200 OK"),
        Then::HeldThenOk { stored: false },
        Then::HeldThenOk { stored: false },
    ])
    .await;
    let config = ProxyConfig::new(&upstream.url())
        .expect("valid upstream")
        .faults(vec![Fault::SlowAfterApply])
        .slow(GUARD);
    let proxy = Proxy::start(config, SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .await
        .expect("proxy");
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let url = format!("http://{}/v1/payments/7", proxy.addr());
    let get = |client: Client<_, Full<Bytes>>, url: String| async move {
        let req = Request::get(url)
            .body(Full::new(Bytes::new()))
            .expect("valid request");
        let res = client.request(req).await.expect("an answer");
        let status = res.status();
        let _ = res.into_body().collect().await;
        status
    };
    // Dropped at the end: the attempts still held are abandoned, as a hedging client does.
    let mut held = JoinSet::new();
    held.spawn(get(client.clone(), url.clone()));
    upstream.wait_received(1).await;
    let hedge = tokio::spawn(get(client.clone(), url.clone()));
    upstream.wait_received(2).await;
    held.spawn(get(client.clone(), url.clone()));
    upstream.wait_received(3).await;
    upstream.release(1);
    let status = tokio::time::timeout(GUARD, hedge)
        .await
        .expect("the hedge is answered")
        .expect("the hedge runs");
    assert_eq!(status, StatusCode::OK);
    // The proxy may finish its side of the released hedge's exchange just after the client
    // has the answer: the counts are read once they have settled (bounded by GUARD).
    let report = settled(&proxy, |row| row.pending == 1).await;
    let row = &report.routes()[0];
    assert_eq!(row.operations, 1);
    assert_eq!(row.attempts, 3);
    assert_eq!(row.answered_ok, 1, "{}", report.table(0));
    assert_eq!(report.reads_recovered(), 1);
    assert_eq!(row.pending, 1);
}

/// The proxy's report once `done` holds for its first route, polled every 10 ms; the last
/// report after `GUARD` (whose assertions then say what did not settle).
async fn settled(proxy: &Proxy, done: impl Fn(&RouteCounts) -> bool) -> ProxyReport {
    let deadline = tokio::time::Instant::now() + GUARD;
    loop {
        let report = proxy.report();
        if report.routes().first().is_some_and(&done) || tokio::time::Instant::now() >= deadline {
            return report;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
