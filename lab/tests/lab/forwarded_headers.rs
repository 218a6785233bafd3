//! What the proxy forwards of a request's head: the body's length, and no header of one hop.

use std::net::{Ipv4Addr, SocketAddr};

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retry_safety_lab::routes::{RouteKind, RouteKinds};
use retry_safety_lab::{Fault, Proxy, ProxyConfig};

use crate::raw_upstream::{RawUpstream, Then};

async fn lab() -> (RawUpstream, Proxy) {
    let upstream = RawUpstream::start(vec![Then::Reply("200 OK")]).await;
    let config = ProxyConfig::new(&upstream.url())
        .expect("valid upstream")
        .faults(vec![Fault::None]);
    let proxy = Proxy::start(config, SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .await
        .expect("proxy");
    (upstream, proxy)
}

/// An HTTP/2 client's bodyless POST, PUT and PATCH carry no length; the upstream, spoken to
/// in HTTP/1.1, is told `content-length: 0`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bodyless_write_from_an_http2_client_is_forwarded_with_content_length_0() {
    let (upstream, proxy) = lab().await;
    let h2 = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    for method in [Method::POST, Method::PUT, Method::PATCH] {
        let req = Request::builder()
            .method(method.clone())
            .uri(format!("http://{}/v1/{method}", proxy.addr()))
            .body(Full::new(Bytes::new()))
            .expect("valid request");
        let res = h2.request(req).await.expect("an answer");
        assert!(res.status().is_success(), "{method}");
        let _ = res.into_body().collect().await;
    }
    let heads = upstream.heads();
    assert_eq!(heads.len(), 3);
    for head in &heads {
        assert!(head.contains("\r\ncontent-length: 0\r\n"), "{head}");
    }
}

/// Headers the request's `Connection` header names belong to the client's hop only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_named_in_connection_are_not_forwarded() {
    let (upstream, proxy) = lab().await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = Request::post(format!("http://{}/v1/x", proxy.addr()))
        .header("connection", "x-hop-secret, keep-alive")
        .header("x-hop-secret", "1")
        .header("x-end-to-end", "1")
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("valid request");
    let res = client.request(req).await.expect("an answer");
    assert!(res.status().is_success());
    let heads = upstream.heads();
    assert_eq!(heads.len(), 1);
    assert!(!heads[0].contains("x-hop-secret"), "{}", heads[0]);
    assert!(heads[0].contains("x-end-to-end: 1"), "{}", heads[0]);
    assert!(heads[0].contains("content-length: 2"), "{}", heads[0]);
}

#[test]
fn a_lowercase_method_in_a_route_rule_is_refused_naming_the_flag() {
    let mut routes = RouteKinds::new();
    let err = routes
        .add("--write", "post /v1/x", RouteKind::Write)
        .expect_err("methods are case-sensitive");
    assert_eq!(err.input(), "--write");
    assert!(err.to_string().contains("\"POST\""), "{err}");
    let err = routes
        .add("--read", "Get /v1/x", RouteKind::Read)
        .expect_err("methods are case-sensitive");
    assert_eq!(err.input(), "--read");
}
