//! Writes the upstream received but never answered whole: the connection broke after it read
//! the request, or its answer was longer than the proxy reads, or it was still running when
//! the proxy was stopped. Each may have applied, so a client's resend applies it twice, and
//! the counts say so exactly. Only a connect error proves a request was not sent.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retry_safety_lab::{Fault, Proxy, ProxyConfig};
use tokio::net::TcpStream;

use crate::raw_upstream::{RawUpstream, Then, GUARD};

/// A proxy that injects no fault, reads bodies up to 1 KiB.
async fn proxy(upstream: &str) -> Proxy {
    let config = ProxyConfig::new(upstream)
        .expect("valid upstream")
        .faults(vec![Fault::None])
        .max_body(1024);
    Proxy::start(config, SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .await
        .expect("proxy")
}

/// A client with no idempotency key that resends a write after an error or a 5xx, up to
/// `attempts` times, as SDKs often do by hand. The status it ended with, if any.
async fn naive_write(proxy: SocketAddr, attempts: u32) -> Option<StatusCode> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut last = None;
    for _ in 0..attempts {
        let req = Request::post(format!("http://{proxy}/v1/payments"))
            .body(Full::new(Bytes::from_static(b"{\"amount\":100}")))
            .expect("valid request");
        last = match client.request(req).await {
            Ok(res) => {
                let status = res.status();
                let _ = res.into_body().collect().await;
                Some(status)
            }
            Err(_) => None,
        };
        if last.is_some_and(|s| !s.is_server_error()) {
            break;
        }
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_connection_broke_after_the_upstream_read_it_is_counted_applied() {
    let upstream = RawUpstream::start(vec![Then::Close]).await;
    let proxy = proxy(&upstream.url()).await;
    let status = naive_write(proxy.addr(), 2).await;
    assert_eq!(status, Some(StatusCode::BAD_GATEWAY));
    assert_eq!(upstream.received(), 2);
    let report = proxy.report();
    let row = &report.routes()[0];
    assert_eq!(row.operations, 1);
    assert_eq!(row.attempts, 2);
    assert_eq!(row.upstream_requests, 2);
    assert_eq!(row.pending, 0);
    assert_eq!(row.applied_twice, 1, "{}", report.table(0));
    assert_eq!(row.failed_sent_no_answer, 1);
    assert_eq!(row.failed_after_upstream, 0);
    assert_eq!(row.failed_provably_unsent, 0);
    assert!(!report.passes(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_answer_is_over_the_body_limit_is_counted_applied() {
    let upstream = RawUpstream::start(vec![Then::Oversized]).await;
    let proxy = proxy(&upstream.url()).await;
    let status = naive_write(proxy.addr(), 2).await;
    assert_eq!(status, Some(StatusCode::BAD_GATEWAY));
    assert_eq!(upstream.received(), 2);
    let report = proxy.report();
    let row = &report.routes()[0];
    assert_eq!(row.attempts, 2);
    assert_eq!(row.upstream_requests, 2);
    assert_eq!(row.applied_twice, 1, "{}", report.table(0));
    assert_eq!(row.failed_sent_no_answer, 1);
    assert!(!report.passes(0));
    let json: serde_json::Value = serde_json::from_str(&report.to_json(0)).expect("JSON");
    assert_eq!(json["routes"][0]["failed_sent_no_answer"], 1);
    assert_eq!(json["pass"], false);
}

/// A refused connection is the one failure that proves the request never left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_the_proxy_could_not_connect_for_is_counted_never_sent() {
    let upstream = RawUpstream::start(vec![Then::Close]).await;
    let url = upstream.url();
    let proxy = proxy(&url).await;
    // The upstream was reachable when the proxy started; now nothing listens there.
    drop(upstream);
    // Let the aborted accept loop release the port.
    let addr: SocketAddr = url.trim_start_matches("http://").parse().expect("addr");
    tokio::time::timeout(GUARD, async {
        while TcpStream::connect(addr).await.is_ok() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the upstream's port closes");
    let status = naive_write(proxy.addr(), 2).await;
    assert_eq!(status, Some(StatusCode::BAD_GATEWAY));
    let report = proxy.report();
    let row = &report.routes()[0];
    assert_eq!(row.attempts, 2);
    assert_eq!(row.upstream_requests, 0);
    assert_eq!(row.applied_twice, 0);
    assert_eq!(row.failed_provably_unsent, 1);
    assert_eq!(row.failed_sent_no_answer, 0);
}

/// Stopping waits for what is still at the upstream: the resend counts from the moment it
/// was forwarded, and the report taken after the drain has it answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_still_at_the_upstream_when_stopped_is_counted_applied() {
    let upstream = RawUpstream::start(vec![Then::Close, Then::HeldThenOk { stored: false }]).await;
    let proxy = proxy(&upstream.url()).await;
    let addr = proxy.addr();
    let client = tokio::spawn(async move { naive_write(addr, 2).await });
    upstream.wait_received(2).await;
    let before = proxy.report();
    assert_eq!(before.applied_twice(), 1, "{}", before.table(0));
    assert_eq!(before.pending(), 1);
    let (report, ()) = tokio::join!(proxy.drain(GUARD), async { upstream.release(1) });
    assert_eq!(report.pending(), 0, "{}", report.table(0));
    assert_eq!(report.upstream_requests(), 2);
    assert_eq!(report.applied_twice(), 1);
    assert!(!report.passes(0));
    // The answer still reaches the client: stopping closes no open connection.
    let status = tokio::time::timeout(GUARD, client).await.expect("answered");
    assert_eq!(status.expect("client runs"), Some(StatusCode::OK));
}

/// The drain is what lets a late answer say the resend ran nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_stop_waits_for_a_late_stored_response() {
    let upstream = RawUpstream::start(vec![Then::Close, Then::HeldThenOk { stored: true }]).await;
    let proxy = proxy(&upstream.url()).await;
    let addr = proxy.addr();
    let client = tokio::spawn(async move { naive_write(addr, 2).await });
    upstream.wait_received(2).await;
    assert_eq!(proxy.report().applied_twice(), 1);
    let (report, ()) = tokio::join!(proxy.drain(GUARD), async { upstream.release(1) });
    assert_eq!(report.pending(), 0, "{}", report.table(0));
    assert_eq!(report.applied_twice(), 0);
    assert!(report.passes(0));
    let status = tokio::time::timeout(GUARD, client).await.expect("answered");
    assert_eq!(status.expect("client runs"), Some(StatusCode::OK));
}

/// A drain that ends before the upstream answers reports the resend pending, and applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_unanswered_after_the_drain_is_reported_pending() {
    let upstream = RawUpstream::start(vec![Then::Close, Then::HeldThenOk { stored: true }]).await;
    let proxy = proxy(&upstream.url()).await;
    let addr = proxy.addr();
    let client = tokio::spawn(async move { naive_write(addr, 2).await });
    upstream.wait_received(2).await;
    let report = proxy.drain(Duration::ZERO).await;
    assert_eq!(report.pending(), 1, "{}", report.table(0));
    assert_eq!(report.routes()[0].pending, 1);
    assert_eq!(report.applied_twice(), 1);
    assert!(!report.passes(0));
    let json: serde_json::Value = serde_json::from_str(&report.to_json(0)).expect("JSON");
    assert_eq!(json["pending"], 1);
    upstream.release(1);
    let status = tokio::time::timeout(GUARD, client).await.expect("answered");
    assert_eq!(status.expect("client runs"), Some(StatusCode::OK));
    assert_eq!(upstream.received(), 2);
}
