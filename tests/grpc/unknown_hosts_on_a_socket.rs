//! Host-scoped write rules and `may_have_been_applied` on a real socket on 127.0.0.1 (the
//! adversarial review of the host-unknown and may-have-been-applied change), through the tower
//! layer and the reqwest middleware: a write rule for the `Host` header holds when the URI
//! names another host, and an ambiguous failure of a read applied nothing while a write's
//! may have been applied. Every count is exact.
#![cfg(feature = "tonic")]

use crate::unknown_host_verdicts::builder;
use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retry_safety_testing::raw_server::{Act, Raw};
use tower::{Layer, ServiceExt};
use tower_retry_safety::{Idempotency, MayHaveBeenApplied, NoRetry};

/// A server that reads each request and closes the connection without answering: every
/// attempt is an ambiguous failure (the request reached the server).
async fn closing_server() -> Raw {
    Raw::start(|_, _| vec![Act::Close]).await
}

/// From the adversarial review of the host/applied change: the URI names one host (the
/// address connected to) and the `Host` header another (the virtual host the server routes
/// on, and the one that applies the write). A rule scoped to the `Host` header's host that
/// calls the PUT a write must hold: where spellings disagree the stricter verdict wins
/// (rules fail closed). The layer reads only the URI's host, so the PUT is sent 3 times.
#[tokio::test]

async fn a_write_rule_for_the_host_header_holds_when_the_uri_names_another_host() {
    let server = closing_server().await;
    let policy = builder()
        .route_for_host(
            "api.test",
            Method::PUT,
            "/v1/send",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let svc = policy.layer(client);
    let req = Request::put(server.url("/v1/send"))
        .header("host", "api.test")
        .body(Full::new(Bytes::from_static(b"once")))
        .unwrap();
    let err = svc.oneshot(req).await.unwrap_err();
    let seen = server.seen();
    assert!(
        seen[0].head.to_ascii_lowercase().contains("host: api.test"),
        "the server routes on api.test: {}",
        seen[0].head
    );
    assert!(err.may_have_been_applied(), "{err}");
    assert_eq!(server.requests(), 1, "the write was sent again: {err}");
}

/// From the adversarial review of the host/applied change: the same attack through the
/// reqwest middleware (a `Host` header set on the request, the URL naming the address).
#[tokio::test]

async fn through_reqwest_a_write_rule_for_the_host_header_holds_when_the_url_names_another_host() {
    use reqwest_middleware::ClientBuilder;
    use tower_retry_safety::RetrySafetyMiddleware;

    let server = closing_server().await;
    let policy = builder()
        .route_for_host(
            "api.test",
            Method::PUT,
            "/v1/send",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetrySafetyMiddleware::new(policy))
        .build();
    let err = client
        .put(server.url("/v1/send"))
        .header("host", "api.test")
        .body("once")
        .send()
        .await
        .unwrap_err();
    let seen = server.seen();
    assert!(
        seen[0].head.to_ascii_lowercase().contains("host: api.test"),
        "the server routes on api.test: {}",
        seen[0].head
    );
    assert!(err.may_have_been_applied(), "{err}");
    assert_eq!(server.requests(), 1, "the write was sent again: {err}");
}

/// From the adversarial review of the host/applied change: a `NoRetry` GET is sent once and,
/// failing ambiguously, applied nothing; a `NoRetry` POST in the same cell may have been
/// applied.
#[tokio::test]
async fn a_no_retry_get_applied_nothing_and_a_no_retry_post_may_have_been_applied() {
    let server = closing_server().await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let svc = builder().build().unwrap().layer(client);
    for (method, applied) in [(Method::GET, false), (Method::POST, true)] {
        let before = server.requests();
        let mut req = Request::builder()
            .method(method.clone())
            .uri(server.url("/v1/item"))
            .body(Full::default())
            .unwrap();
        req.extensions_mut().insert(NoRetry);
        let err = svc.clone().oneshot(req).await.unwrap_err();
        assert_eq!(server.requests() - before, 1, "{method}");
        assert!(err.is_ambiguous(), "{method}: {err}");
        assert_eq!(err.may_have_been_applied(), applied, "{method}: {err}");
        assert_eq!(
            err.report().unwrap().may_have_been_applied(),
            applied,
            "{method}"
        );
    }
}

/// From the adversarial review of the host/applied change: a GET that a host-scoped rule
/// calls a write is sent once and may have been applied (the URI shows the host).
#[tokio::test]
async fn a_get_a_host_scoped_rule_calls_a_write_is_sent_once_and_may_have_been_applied() {
    let server = closing_server().await;
    let policy = builder()
        .route_for_host(
            "127.0.0.1",
            Method::GET,
            "/v1/trigger",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let svc = policy.layer(client);
    let req = Request::get(server.url("/v1/trigger"))
        .body(Full::default())
        .unwrap();
    let err = svc.clone().oneshot(req).await.unwrap_err();
    assert_eq!(server.requests(), 1);
    assert!(err.may_have_been_applied(), "{err}");
    // A plain GET on the same server: retried (3 attempts), and applied nothing.
    let req = Request::get(server.url("/v1/read"))
        .body(Full::default())
        .unwrap();
    let err = svc.oneshot(req).await.unwrap_err();
    assert_eq!(server.requests(), 4);
    assert!(err.is_ambiguous() && !err.may_have_been_applied(), "{err}");
}
