//! Resends that do not look like their first attempt: a multipart body under a new boundary,
//! a new idempotency key. Each is still one operation, and a write that reached the upstream
//! twice is counted so; calls that are truly distinct stay distinct.

use std::net::{Ipv4Addr, SocketAddr};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retry_safety_lab::{Fault, Proxy, ProxyConfig, Upstream};

/// Writes per test.
const OPS: u64 = 6;

async fn lab(faults: Vec<Fault>) -> (Upstream, Proxy) {
    let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let upstream = Upstream::start(loopback).await.expect("upstream");
    let config = ProxyConfig::new(&format!("http://{}", upstream.addr()))
        .expect("valid upstream")
        .faults(faults);
    let proxy = Proxy::start(config, loopback).await.expect("proxy");
    (upstream, proxy)
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Sends `attempt(n)` until an answer that is not a 5xx, at most twice (one resend), as an
/// SDK's retry loop does.
async fn with_one_resend(
    client: &Client<HttpConnector, Full<Bytes>>,
    attempt: impl Fn(u32) -> Request<Full<Bytes>>,
) {
    for n in 0..2 {
        let res = client.request(attempt(n)).await.expect("an answer");
        let status = res.status();
        let _ = res.into_body().collect().await;
        if !status.is_server_error() {
            return;
        }
    }
}

/// A multipart upload whose boundary is drawn per attempt, as httpx and undici's FormData
/// draw it.
fn upload(url: &str, op: u64, boundary: &str) -> Request<Full<Bytes>> {
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nfine-tune\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"train-{op}.jsonl\"\r\nContent-Type: application/octet-stream\r\n\r\n{{\"prompt\":\"p{op}\"}}\n\r\n--{boundary}--\r\n"
    );
    Request::post(url)
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(Full::new(Bytes::from(body)))
        .expect("valid request")
}

/// The openai SDKs' `files.create` (Python and Node) draws a new multipart boundary per
/// attempt: byte for byte, the resend is another request. Every upload here got a 503 after
/// the upstream applied it and was sent again: the upstream ran each twice, and the lab
/// says so. Before, each attempt was an operation of its own: "0 applied twice", a pass.
/// Issue 41 item 16, real SDKs through the lab.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_resent_under_a_new_multipart_boundary_is_counted_applied_twice() {
    let (upstream, proxy) = lab(vec![Fault::UnavailableAfterApply]).await;
    let url = format!("http://{}/v1/files", proxy.addr());
    let client = client();
    for op in 0..OPS {
        with_one_resend(&client, |n| {
            upload(&url, op, &format!("----boundary-{op}-{n}-{}", n * 7919))
        })
        .await;
    }
    assert_eq!(upstream.handler_runs(), 2 * OPS);
    let report = proxy.report();
    let row = &report.routes()[0];
    assert_eq!(row.operations, OPS, "{}", report.table(0));
    assert_eq!(row.attempts, 2 * OPS);
    assert_eq!(row.upstream_requests, 2 * OPS);
    assert_eq!(row.applied_twice, OPS, "{}", report.table(0));
    // No key either time: one request sent again, not uncertain.
    assert_eq!(row.uncertain, 0);
    assert!(!report.passes(0));
}

fn keyed_write(url: &str, op: u64, key: &str) -> Request<Full<Bytes>> {
    Request::post(url)
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from(format!("{{\"amount\":{op}}}"))))
        .expect("valid request")
}

/// A client that mints a new idempotency key per retry: the server (tower-idempotency-keys' layer,
/// honouring keys) cannot tell the resend from a new call and runs it again. The lab links
/// the resend to its first attempt by content, counts the write applied twice, and marks
/// the link uncertain. Before, the new key made a new operation: "0 applied twice", a pass.
/// Issue 41 item 16, real SDKs through the lab.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_with_a_new_key_is_counted_applied_twice_and_uncertain() {
    let (upstream, proxy) = lab(vec![Fault::UnavailableAfterApply]).await;
    let url = format!("http://{}/v1/payments", proxy.addr());
    let client = client();
    for op in 0..OPS {
        with_one_resend(&client, |n| keyed_write(&url, op, &format!("key-{op}-{n}"))).await;
    }
    assert_eq!(upstream.handler_runs(), 2 * OPS);
    let report = proxy.report();
    let row = &report.routes()[0];
    assert_eq!(row.operations, OPS, "{}", report.table(0));
    assert_eq!(row.attempts, 2 * OPS);
    assert_eq!(row.applied_twice, OPS, "{}", report.table(0));
    assert_eq!(row.uncertain, OPS);
    assert_eq!(report.uncertain(), OPS);
    assert!(!report.passes(0));
    let table = report.table(0);
    assert!(table.contains(&format!("{OPS} uncertain")), "{table}");
    let json: serde_json::Value = serde_json::from_str(&report.to_json(0)).expect("JSON");
    assert_eq!(json["uncertain"], OPS);
    assert_eq!(json["pass"], false);
}

/// The other side of linking by content: calls with one body and keys of their own, each
/// answered 2xx before the next, are distinct calls, not resends; none is uncertain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answered_calls_with_one_body_and_their_own_keys_stay_distinct() {
    let (upstream, proxy) = lab(vec![Fault::None]).await;
    let url = format!("http://{}/v1/payments", proxy.addr());
    let client = client();
    for n in 0..OPS {
        with_one_resend(&client, |_| keyed_write(&url, 0, &format!("call-{n}"))).await;
    }
    assert_eq!(upstream.handler_runs(), OPS);
    let report = proxy.report();
    let row = &report.routes()[0];
    assert_eq!(row.operations, OPS, "{}", report.table(0));
    assert_eq!(row.applied_twice, 0);
    assert_eq!(row.uncertain, 0);
    assert_eq!(row.answered_ok, OPS);
    assert!(report.passes(0), "{}", report.table(0));
}

/// With an op header set by the harness, the header alone decides: attempts with one header
/// value are one operation even with keys of their own, and that is certain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_op_header_alone_links_attempts_when_present() {
    let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let upstream = Upstream::start(loopback).await.expect("upstream");
    let config = ProxyConfig::new(&format!("http://{}", upstream.addr()))
        .expect("valid upstream")
        .faults(vec![Fault::UnavailableAfterApply])
        .identity(
            retry_safety_lab::op_id::OpIdentity::new()
                .op_header("x-lab-op")
                .expect("valid name"),
        );
    let proxy = Proxy::start(config, loopback).await.expect("proxy");
    let url = format!("http://{}/v1/payments", proxy.addr());
    let client = client();
    for op in 0..OPS {
        with_one_resend(&client, |n| {
            let mut req = keyed_write(&url, 0, &format!("key-{op}-{n}"));
            req.headers_mut()
                .insert("x-lab-op", format!("op-{op}").parse().expect("valid"));
            req
        })
        .await;
    }
    assert_eq!(upstream.handler_runs(), 2 * OPS);
    let report = proxy.report();
    let row = &report.routes()[0];
    assert_eq!(row.operations, OPS, "{}", report.table(0));
    assert_eq!(row.applied_twice, OPS);
    // Named by the harness: certain.
    assert_eq!(row.uncertain, 0);
}
