//! A run passes only when it checked something: a proxy that saw no write, or refused the
//! bodies it was sent, has verified nothing, and says so.

use std::net::{Ipv4Addr, SocketAddr};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retry_safety_lab::{Proxy, ProxyConfig, Upstream};

use crate::raw_upstream::GUARD;

async fn lab(max_body: usize) -> (Upstream, Proxy) {
    let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let upstream = Upstream::start(loopback).await.expect("upstream");
    let config = ProxyConfig::new(&format!("http://{}", upstream.addr()))
        .expect("valid upstream")
        .max_body(max_body);
    let proxy = Proxy::start(config, loopback).await.expect("proxy");
    (upstream, proxy)
}

/// A run whose client never reached the proxy (a wrong base URL, a test suite that ran no
/// test): "0 / 0 applied twice" was a pass. Issue 41 item 16, real SDKs through the lab.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_reached_nothing_fails() {
    let (upstream, proxy) = lab(1024).await;
    let report = proxy.drain(GUARD).await;
    assert_eq!(report.writes(), 0);
    assert!(!report.passes(0), "{}", report.table(0));
    let table = report.table(0);
    assert!(table.contains("FAIL"), "{table}");
    assert!(table.contains("no write reached the lab"), "{table}");
    let json: serde_json::Value = serde_json::from_str(&report.to_json(0)).expect("JSON");
    assert_eq!(json["pass"], false);
    assert_eq!(upstream.handler_runs(), 0);
}

/// Every body over `--max-body` was refused 413 and never seen whole, let alone checked:
/// that was a pass. Issue 41 item 16, real SDKs through the lab.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_bodies_were_all_refused_fails() {
    let (upstream, proxy) = lab(1024).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    for _ in 0..3 {
        let req = Request::post(format!("http://{}/v1/files", proxy.addr()))
            .body(Full::new(Bytes::from(vec![b'x'; 4096])))
            .expect("valid request");
        let res = client.request(req).await.expect("an answer");
        assert_eq!(res.status(), 413);
        let _ = res.into_body().collect().await;
    }
    let report = proxy.report();
    assert_eq!(report.refused_over_limit(), 3);
    assert!(!report.passes(0), "{}", report.table(0));
    assert!(
        report.table(0).contains("3 requests were refused"),
        "{}",
        report.table(0)
    );
    let json: serde_json::Value = serde_json::from_str(&report.to_json(0)).expect("JSON");
    assert_eq!(json["refused_over_limit"], 3);
    assert_eq!(upstream.handler_runs(), 0);
}
