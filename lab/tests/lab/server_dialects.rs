//! Servers that mark stored responses, name keys, or refuse requests in their own way: what their
//! answers say about a resend is read as they say it, and only then.

use std::net::{Ipv4Addr, SocketAddr};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retry_safety_lab::op_id::OpIdentity;
use retry_safety_lab::{Fault, Proxy, ProxyConfig, ProxyReport};

use crate::raw_upstream::{RawUpstream, Then};

/// Starts an upstream answering `plan`, a proxy (no fault) in front of it configured by
/// `configure`, sends one write twice with `header` (the client's resend), and reports.
async fn resend_through(
    plan: Vec<Then>,
    configure: impl FnOnce(ProxyConfig) -> ProxyConfig,
    header: (&str, &str),
) -> ProxyReport {
    let upstream = RawUpstream::start(plan).await;
    let config = ProxyConfig::new(&upstream.url())
        .expect("valid upstream")
        .faults(vec![Fault::None]);
    let proxy = Proxy::start(
        configure(config),
        SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
    )
    .await
    .expect("proxy");
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    for _ in 0..2 {
        let req = Request::post(format!("http://{}/v1/payments", proxy.addr()))
            .header(header.0, header.1)
            .body(Full::new(Bytes::from_static(b"{\"amount\":100}")))
            .expect("valid request");
        let res = client.request(req).await.expect("an answer");
        let _ = res.into_body().collect().await;
    }
    assert_eq!(upstream.received(), 2);
    let report = proxy.report();
    assert_eq!(report.routes()[0].operations, 1, "{}", report.table(0));
    assert_eq!(report.upstream_requests(), 2);
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_response_marked_by_the_named_header_is_not_counted_applied() {
    let plan = || {
        vec![
            Then::Reply("201 Created"),
            Then::Reply("201 Created\r\nx-replayed: true"),
        ]
    };
    let key = ("idempotency-key", "k-1");
    let unnamed = resend_through(plan(), |c| c, key).await;
    assert_eq!(unnamed.applied_twice(), 1, "{}", unnamed.table(0));
    let named = resend_through(
        plan(),
        |c| c.replayed_header("x-replayed").expect("valid name"),
        key,
    )
    .await;
    assert_eq!(named.applied_twice(), 0, "{}", named.table(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_to_a_key_in_the_named_header_is_not_counted_applied() {
    let plan = || vec![Then::Reply("201 Created"), Then::Reply("409 Conflict")];
    let key = ("x-idem-key", "k-1");
    let unnamed = resend_through(plan(), |c| c, key).await;
    assert_eq!(unnamed.applied_twice(), 1, "{}", unnamed.table(0));
    let named = resend_through(
        plan(),
        |c| {
            c.identity(
                OpIdentity::new()
                    .key_header_name("x-idem-key")
                    .expect("valid name"),
            )
        },
        key,
    )
    .await;
    assert_eq!(named.applied_twice(), 0, "{}", named.table(0));
}

/// RFC 6585: a 429 refuses the request for its rate; the resend is the one that runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_429_is_not_counted_applied() {
    let plan = vec![
        Then::Reply("429 Too Many Requests\r\nretry-after: 0"),
        Then::Reply("201 Created"),
    ];
    let report = resend_through(plan, |c| c, ("x-request", "r-1")).await;
    assert_eq!(report.applied_twice(), 0, "{}", report.table(0));
    assert_eq!(report.writes_answered(), 1);
}

/// A 503 says nothing about whether the handler ran first, `Retry-After` or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_503_with_retry_after_is_counted_applied() {
    let plan = vec![
        Then::Reply("503 Service Unavailable\r\nretry-after: 0"),
        Then::Reply("201 Created"),
    ];
    let report = resend_through(plan, |c| c, ("x-request", "r-1")).await;
    assert_eq!(report.applied_twice(), 1, "{}", report.table(0));
}

#[test]
fn a_bad_key_or_replayed_header_name_is_refused_naming_the_flag() {
    let err = OpIdentity::new()
        .key_header_name("bad name")
        .expect_err("a space");
    assert_eq!(err.input(), "--key-header");
    let err = ProxyConfig::new("http://127.0.0.1:1")
        .expect("valid upstream")
        .replayed_header("bad name")
        .expect_err("a space");
    assert_eq!(err.input(), "--replayed-header");
}
