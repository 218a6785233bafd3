//! How the proxy tells operations apart: key, a chosen header, a JSON pointer, a fingerprint.

use http::{HeaderMap, Method};
use tower_retry_safety::lab::OpIdentity;

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.insert(*name, value.parse().expect("valid value"));
    }
    map
}

#[test]
fn a_key_names_the_operation_whatever_the_body_and_its_quoting() {
    let id = OpIdentity::new();
    let a = id.identify(
        &Method::POST,
        "/v1/a",
        &headers(&[("idempotency-key", "\"k-1\"")]),
        b"one",
    );
    let b = id.identify(
        &Method::POST,
        "/v1/b",
        &headers(&[("idempotency-key", "k-1")]),
        b"two",
    );
    assert_eq!(a, b);
}

#[test]
fn the_chosen_header_names_the_operation_when_no_key_does() {
    let id = OpIdentity::new().op_header("x-request-id").expect("valid");
    let a = id.identify(
        &Method::POST,
        "/v1",
        &headers(&[("x-request-id", "r1")]),
        b"1",
    );
    let b = id.identify(
        &Method::POST,
        "/v1",
        &headers(&[("x-request-id", "r1")]),
        b"2",
    );
    let c = id.identify(
        &Method::POST,
        "/v1",
        &headers(&[("x-request-id", "r2")]),
        b"1",
    );
    assert_eq!(a, b);
    assert_ne!(a, c);
    // A key outranks the chosen header.
    let keyed = headers(&[("x-request-id", "r1"), ("idempotency-key", "k")]);
    assert_ne!(a, id.identify(&Method::POST, "/v1", &keyed, b"1"));
}

#[test]
fn without_key_or_header_the_body_fingerprint_tells_operations_apart() {
    let id = OpIdentity::new();
    let none = HeaderMap::new();
    let a = id.identify(&Method::POST, "/v1", &none, b"{\"n\":1}");
    assert_eq!(a, id.identify(&Method::POST, "/v1", &none, b"{\"n\":1}"));
    assert_ne!(a, id.identify(&Method::POST, "/v1", &none, b"{\"n\":2}"));
    assert_ne!(a, id.identify(&Method::PUT, "/v1", &none, b"{\"n\":1}"));
    assert_ne!(
        a,
        id.identify(&Method::POST, "/v1?x=1", &none, b"{\"n\":1}")
    );
}

#[test]
fn a_json_pointer_names_the_operation_when_bodies_differ_per_attempt() {
    let id = OpIdentity::new()
        .op_id_pointer("/request/id")
        .expect("valid");
    let none = HeaderMap::new();
    let a = id.identify(
        &Method::POST,
        "/v1",
        &none,
        br#"{"request":{"id":"op-7"},"sent_at":1}"#,
    );
    let b = id.identify(
        &Method::POST,
        "/v1",
        &none,
        br#"{"request":{"id":"op-7"},"sent_at":2}"#,
    );
    let c = id.identify(
        &Method::POST,
        "/v1",
        &none,
        br#"{"request":{"id":"op-8"},"sent_at":1}"#,
    );
    assert_eq!(a, b);
    assert_ne!(a, c);
    // Not JSON, or no value there: the fingerprint decides.
    let d = id.identify(&Method::POST, "/v1", &none, b"not json");
    assert!(d.as_str().contains("sha256:"), "{d}");
}

#[test]
fn a_malformed_pointer_or_header_name_is_refused_naming_the_flag() {
    let err = OpIdentity::new().op_id_pointer("request/id").unwrap_err();
    assert_eq!(err.input(), "--op-id");
    let err = OpIdentity::new().op_id_pointer("/a~2").unwrap_err();
    assert_eq!(err.input(), "--op-id");
    let err = OpIdentity::new().op_header("bad header").unwrap_err();
    assert_eq!(err.input(), "--op-header");
}

#[test]
fn a_long_operation_id_is_shown_capped() {
    let long = "k".repeat(500);
    let id = OpIdentity::new().identify(
        &Method::POST,
        "/v1",
        &headers(&[("idempotency-key", &long)]),
        b"",
    );
    assert!(id.to_string().chars().count() <= 65, "{id}");
    let debug = format!("{id:?}");
    assert!(!debug.contains(&"k".repeat(65)), "{debug}");
    assert!(debug.chars().count() <= 65 + "OpId(\"\")".len(), "{debug}");
}

/// The proxy's `Debug` shows counts, not the keys, header values or paths it was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxys_debug_shows_no_operation_id() {
    use bytes::Bytes;
    use http_body_util::Full;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use std::net::{Ipv4Addr, SocketAddr};
    use tower_retry_safety::lab::{Proxy, ProxyConfig, Upstream};

    let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let upstream = Upstream::start(loopback).await.expect("upstream");
    let config = ProxyConfig::new(&format!("http://{}", upstream.addr()))
        .expect("valid upstream")
        .faults(vec![tower_retry_safety::lab::Fault::None]);
    let proxy = Proxy::start(config, loopback).await.expect("proxy");
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = http::Request::post(format!("http://{}/v1/x?token=query-secret", proxy.addr()))
        .header("idempotency-key", "key-secret")
        .body(Full::new(Bytes::new()))
        .expect("valid request");
    let res = client.request(req).await.expect("an answer");
    assert!(res.status().is_success());
    let debug = format!("{proxy:?}");
    assert!(!debug.contains("key-secret"), "{debug}");
    assert!(!debug.contains("query-secret"), "{debug}");
    assert!(debug.contains("operations: 1"), "{debug}");
}
