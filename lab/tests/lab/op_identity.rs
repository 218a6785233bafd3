//! What an attempt says about its operation: key, a chosen header, a JSON pointer, a
//! fingerprint (the ledger's linking of them is tried through the proxy in
//! `resends_in_disguise.rs`).

use http::{HeaderMap, Method};
use retry_safety_lab::op_id::OpIdentity;

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
    assert_eq!(a.key(), b.key());
    assert!(a.key().is_some());
    assert_ne!(a.content(), b.content());
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
    assert_eq!(a.op_header(), b.op_header());
    assert!(a.op_header().is_some());
    assert_ne!(a.op_header(), c.op_header());
    // Without the header, there is none.
    let plain = id.identify(&Method::POST, "/v1", &HeaderMap::new(), b"1");
    assert_eq!(plain.op_header(), None);
}

#[test]
fn without_key_or_header_the_body_fingerprint_tells_operations_apart() {
    let id = OpIdentity::new();
    let none = HeaderMap::new();
    let content = |method: &Method, path: &str, body: &[u8]| {
        id.identify(method, path, &none, body).content().clone()
    };
    let a = content(&Method::POST, "/v1", b"{\"n\":1}");
    assert_eq!(a, content(&Method::POST, "/v1", b"{\"n\":1}"));
    assert_ne!(a, content(&Method::POST, "/v1", b"{\"n\":2}"));
    assert_ne!(a, content(&Method::PUT, "/v1", b"{\"n\":1}"));
    assert_ne!(a, content(&Method::POST, "/v1?x=1", b"{\"n\":1}"));
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
    assert_eq!(a.content(), b.content());
    assert_ne!(a.content(), c.content());
    // Not JSON, or no value there: the fingerprint decides.
    let d = id.identify(&Method::POST, "/v1", &none, b"not json");
    assert!(d.content().as_str().contains("sha256:"), "{}", d.content());
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
    let key = id.key().expect("keyed");
    assert!(key.to_string().chars().count() <= 65, "{key}");
    let debug = format!("{key:?} {id:?}");
    assert!(!debug.contains(&"k".repeat(65)), "{debug}");
    assert!(
        format!("{key:?}").chars().count() <= 65 + "OpId(\"\")".len(),
        "{debug}"
    );
}

/// The proxy's `Debug` shows counts, not the keys, header values or paths it was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxys_debug_shows_no_operation_id() {
    use bytes::Bytes;
    use http_body_util::Full;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use retry_safety_lab::{Proxy, ProxyConfig, Upstream};
    use std::net::{Ipv4Addr, SocketAddr};

    let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let upstream = Upstream::start(loopback).await.expect("upstream");
    let config = ProxyConfig::new(&format!("http://{}", upstream.addr()))
        .expect("valid upstream")
        .faults(vec![retry_safety_lab::Fault::None]);
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
