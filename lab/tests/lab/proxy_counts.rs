//! The proxy in front of the lab's upstream, driven by real clients through real sockets:
//! the counts are exact, as the default mix implies.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retry_safety_lab::op_id::OpIdentity;
use retry_safety_lab::routes::{RouteKind, RouteKinds};
use retry_safety_lab::{run_stack, Fault, Proxy, ProxyConfig, Upstream};
use tower::{ServiceBuilder, ServiceExt};
use tower_retry_safety::RetryPolicy;

use crate::stacks::{run_stack_with, TypicalPolicy};

/// 10 operations per fault of the default mix, per kind.
const OPS: usize = 60;
/// Far below the proxy's slow hold (20 s in `run_stack`), far above a loopback round trip.
const PER_ATTEMPT: Duration = Duration::from_secs(2);

fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

fn policy() -> tower_retry_safety::RetryPolicyBuilder {
    RetryPolicy::builder()
        .lock_free_budget(Duration::from_secs(10), 100, 0.2)
        .attempt_timeout(PER_ATTEMPT)
}

/// The faults that reach the upstream and then fail the attempt: a client that retries them
/// applies the write twice.
fn failing_after_apply(ops: usize) -> u64 {
    let per_fault = ops / Fault::DEFAULT_MIX.len();
    let count = Fault::DEFAULT_MIX
        .iter()
        .filter(|f| f.forwards() && **f != Fault::None)
        .count();
    (count * per_fault) as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typical_tower_retry_applies_every_write_that_failed_after_apply_twice() {
    let svc = ServiceBuilder::new()
        .retry(TypicalPolicy::new(3))
        .timeout(PER_ATTEMPT)
        .service(client());
    let report = run_stack(svc, OPS).await.expect("lab starts");
    assert_eq!(report.writes(), OPS as u64);
    assert_eq!(report.reads(), OPS as u64);
    // drop, slow and 503 after apply: 3 of 6.
    assert_eq!(report.applied_twice(), failing_after_apply(OPS));
    assert_eq!(report.applied_twice(), 30);
    assert_eq!(report.reads_recovered(), OPS as u64);
    assert_eq!(report.writes_answered(), OPS as u64);
    assert!(!report.passes(0));
    assert!(report.passes(30));
}

/// The proxy speaks HTTP/2 to clients that do (prior knowledge, as gRPC-style clients), and
/// counts them as it counts HTTP/1.1 ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_is_counted_as_an_http1_client_is() {
    let h2 = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let naive = ServiceBuilder::new()
        .retry(TypicalPolicy::new(3))
        .timeout(PER_ATTEMPT)
        .service(h2.clone());
    let report = run_stack(naive, OPS).await.expect("lab starts");
    assert_eq!(report.writes(), OPS as u64);
    assert_eq!(report.applied_twice(), failing_after_apply(OPS));
    assert_eq!(report.reads_recovered(), OPS as u64);
    let ours = ServiceBuilder::new()
        .layer(policy().build().expect("valid policy"))
        .service(h2);
    let report = run_stack(ours, OPS).await.expect("lab starts");
    assert_eq!(report.applied_twice(), 0);
    assert_eq!(report.reads_recovered(), OPS as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_crates_layer_applies_no_write_twice_and_recovers_every_read() {
    let svc = ServiceBuilder::new()
        .layer(policy().build().expect("valid policy"))
        .service(client());
    let report = run_stack(svc, OPS).await.expect("lab starts");
    assert_eq!(report.writes(), OPS as u64);
    assert_eq!(report.applied_twice(), 0);
    assert_eq!(report.reads_recovered(), OPS as u64);
    assert!(report.passes(0));
    // The writes that failed after apply are answered with an error or the failed response,
    // after reaching the upstream; those refused before apply were never sent.
    let writes = &report.routes()[..]
        .iter()
        .find(|r| r.kind == RouteKind::Write)
        .expect("a write route")
        .clone();
    assert_eq!(writes.route, "POST /v1/payments");
    assert_eq!(writes.answered_ok, (OPS / 6) as u64);
    assert_eq!(writes.failed_after_upstream, (3 * OPS / 6) as u64);
    assert_eq!(writes.failed_provably_unsent, (2 * OPS / 6) as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_minted_keys_every_write_succeeds_and_none_is_applied_twice() {
    let svc = ServiceBuilder::new()
        .layer(
            policy()
                .mint_idempotency_keys(true)
                .build()
                .expect("valid policy"),
        )
        .service(client());
    let report = run_stack(svc, OPS).await.expect("lab starts");
    assert_eq!(report.applied_twice(), 0);
    assert_eq!(report.writes_answered(), OPS as u64);
    assert_eq!(report.reads_recovered(), OPS as u64);
}

/// Nothing lost, nothing counted twice with many operations in flight: 120 operations per
/// kind, 64 in flight (`RETRY_SAFETY_SOAK=1`: 1,020). With keys, a write's resend is
/// answered from the stored response, so each op's upstream requests are known exactly:
/// one, or two after a fault that failed the attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_stay_exact_with_64_operations_in_flight() {
    let ops = if std::env::var_os("RETRY_SAFETY_SOAK").is_some() {
        1020
    } else {
        120
    };
    let svc = ServiceBuilder::new()
        .layer(
            policy()
                .lock_free_budget(Duration::from_secs(10), 10_000, 1.0)
                .mint_idempotency_keys(true)
                .build()
                .expect("valid policy"),
        )
        .service(client());
    let report = run_stack_with(svc, ops, 64).await.expect("lab starts");
    let ops = ops as u64;
    assert_eq!(report.writes(), ops);
    assert_eq!(report.reads(), ops);
    assert_eq!(report.applied_twice(), 0);
    assert_eq!(report.writes_answered(), ops);
    assert_eq!(report.reads_recovered(), ops);
    // Per kind: none 1, drop/slow/503 2 (the resend), 429/500 1 (only the resend).
    assert_eq!(report.upstream_requests(), 2 * (ops / 6) * 9);
    let attempts: u64 = report.routes().iter().map(|r| r.attempts).sum();
    // Every fault but none costs a resend.
    assert_eq!(attempts, 2 * (ops + ops / 6 * 5));
}

/// A client with no retry layer at all: a loop that resends after any error or 5xx/429, as
/// SDKs in other languages often do by hand. It sends its own `x-request-id`, repeated on
/// every attempt, which the proxy is told to read; bodies carry a timestamp that differs per
/// attempt, so a body fingerprint would miscount.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_loop_client_is_counted_by_its_request_id_header() {
    let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let upstream = Upstream::start(loopback).await.expect("upstream");
    let mut routes = RouteKinds::new();
    routes
        .add("--write", "POST /v1/tools/{slug}/execute", RouteKind::Write)
        .expect("valid rule");
    let config = ProxyConfig::new(&format!("http://{}", upstream.addr()))
        .expect("valid upstream")
        .identity(OpIdentity::new().op_header("x-request-id").expect("valid"))
        .routes(routes)
        .slow(Duration::from_secs(20));
    let proxy = Proxy::start(config, loopback).await.expect("proxy");
    let client = client();
    let mut tasks = tokio::task::JoinSet::new();
    for op in 0..12 {
        let client = client.clone();
        let url = format!("http://{}/v1/tools/send_email/execute", proxy.addr());
        tasks.spawn(async move {
            for attempt in 0..4 {
                let body = format!("{{\"to\":\"a@example.com\",\"sent_at\":{attempt}}}");
                let req = Request::builder()
                    .method(Method::POST)
                    .uri(&url)
                    .header("x-request-id", format!("req-{op}"))
                    .body(Full::new(Bytes::from(body)))
                    .expect("valid request");
                let sent = tokio::time::timeout(PER_ATTEMPT, client.request(req)).await;
                if let Ok(Ok(res)) = sent {
                    let status = res.status();
                    let _ = res.into_body().collect().await;
                    if !(status.is_server_error() || status == 429) {
                        return;
                    }
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let report = proxy.report();
    assert_eq!(report.routes().len(), 1);
    let row = &report.routes()[0];
    assert_eq!(row.route, "POST /v1/tools/{slug}/execute");
    assert_eq!(row.operations, 12);
    assert_eq!(row.applied_twice, 6);
    assert_eq!(row.answered_ok, 12);
    // 12 first attempts, 10 resends (none and… the two "none" ops are not resent).
    assert_eq!(row.attempts, 22);
    assert_eq!(upstream.handler_runs(), 18);
    let table = report.table(0);
    assert!(table.contains("POST /v1/tools/{slug}/execute"), "{table}");
    assert!(table.contains("FAIL"), "{table}");
    let json: serde_json::Value = serde_json::from_str(&report.to_json(0)).expect("JSON");
    assert_eq!(json["applied_twice"], 6);
    assert_eq!(json["pass"], false);
    assert_eq!(json["routes"][0]["operations"], 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_before_forwarding_never_reaches_the_upstream() {
    let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let upstream = Upstream::start(loopback).await.expect("upstream");
    let config = ProxyConfig::new(&format!("http://{}", upstream.addr()))
        .expect("valid upstream")
        .faults(vec![Fault::ResetBeforeForwarding]);
    let proxy = Proxy::start(config, loopback).await.expect("proxy");
    let req = Request::post(format!("http://{}/v1/x", proxy.addr()))
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("valid request");
    assert!(client().oneshot(req).await.is_err());
    let report = proxy.report();
    assert_eq!(report.routes()[0].route, "POST (any path)");
    assert_eq!(report.routes()[0].failed_provably_unsent, 1);
    assert_eq!(report.upstream_requests(), 0);
    assert_eq!(upstream.handler_runs(), 0);
}

/// `REFUSED_STREAM` tells an HTTP/2 client the request was not processed: tower-retry-safety's layer
/// resends even a write, which the upstream then applies once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_stream_is_resent_by_this_crates_layer_and_applied_once() {
    let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let upstream = Upstream::start(loopback).await.expect("upstream");
    let config = ProxyConfig::new(&format!("http://{}", upstream.addr()))
        .expect("valid upstream")
        .faults(vec![Fault::RefusedStream]);
    let proxy = Proxy::start(config, loopback).await.expect("proxy");
    let h2 = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let svc = ServiceBuilder::new()
        .layer(policy().build().expect("valid policy"))
        .service(h2);
    for op in 0..3 {
        let req = Request::post(format!("http://{}/v1/charges", proxy.addr()))
            .body(Full::new(Bytes::from(format!("{{\"op\":{op}}}"))))
            .expect("valid request");
        let res = svc
            .clone()
            .oneshot(req)
            .await
            .expect("resent after the refusal");
        assert!(res.status().is_success());
    }
    let report = proxy.report();
    let row = &report.routes()[0];
    assert_eq!(row.operations, 3);
    assert_eq!(row.attempts, 6);
    assert_eq!(row.upstream_requests, 3);
    assert_eq!(row.applied_twice, 0);
    assert_eq!(row.answered_ok, 3);
    assert_eq!(upstream.handler_runs(), 3);
}

/// The proxy's memory is bounded by its body limit: a longer request is refused, not
/// forwarded and not counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_refused_and_not_counted() {
    let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let upstream = Upstream::start(loopback).await.expect("upstream");
    let config = ProxyConfig::new(&format!("http://{}", upstream.addr()))
        .expect("valid upstream")
        .max_body(1024);
    let proxy = Proxy::start(config, loopback).await.expect("proxy");
    let req = Request::post(format!("http://{}/v1/files", proxy.addr()))
        .body(Full::new(Bytes::from(vec![b'x'; 4096])))
        .expect("valid request");
    let res = client().oneshot(req).await.expect("an answer");
    assert_eq!(res.status(), 413);
    assert!(proxy.report().routes().is_empty());
    assert_eq!(upstream.handler_runs(), 0);
}

#[test]
fn route_rules_decide_the_kind_and_name_the_row() {
    let mut routes = RouteKinds::new();
    routes
        .add("--write", "POST /v1/{*rest}", RouteKind::Write)
        .expect("valid");
    routes
        .add("--read", "POST /v1/search", RouteKind::Read)
        .expect("valid");
    assert_eq!(
        routes.classify(&Method::POST, "/v1/search"),
        (RouteKind::Read, "POST /v1/search".to_owned())
    );
    assert_eq!(
        routes.classify(&Method::POST, "/v1/messages/send"),
        (RouteKind::Write, "POST /v1/{*rest}".to_owned())
    );
    assert_eq!(
        routes.classify(&Method::GET, "/v1/messages"),
        (RouteKind::Read, "GET (any path)".to_owned())
    );
    let err = routes
        .add("--write", "POST v1/x", RouteKind::Write)
        .expect_err("no leading slash");
    assert_eq!(err.input(), "--write");
    let err = routes
        .add("--read", "/v1/x", RouteKind::Read)
        .expect_err("no method");
    assert_eq!(err.input(), "--read");
}
