//! Never twice (the adversarial review of safe hedging and the per-attempt spans, issue 25),
//! against real hyper servers on 127.0.0.1 that count side effects: a write without a key its
//! target is trusted to honour, or with a streaming body, is never hedged, through the tower
//! layer or the reqwest adapter. (A keyed write hedged by opt-in is applied once, and no hedge
//! follows a keyed hedge's 409, the defect this review found: the end-to-end tests'
//! `hedging/keyed_hedges.rs`, against the server's `IdempotencyLayer`.)

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use retry_safety_testing::fault_server::FaultServer;
use retry_safety_testing::hedging_stacks::{eager, hedging, loopback_req, send};
use tower::{Layer, ServiceExt};
use tower_retry_safety::{Hedge, Idempotency, NoRetry, RequestOptions, RetryPolicy, RetryReport};

/// Never twice: every write that is not idempotent and has no key its target is trusted to
/// honour reaches the server exactly once though it takes 10× the hedge delay, under the most
/// eager settings, with the hedge budget full (ten fast reads deposited first); the same
/// settings do hedge a slow read (the control), so the test can fail.
///
/// Found by the adversarial review of safe hedging and the per-attempt spans (issue 25).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_write_without_a_trusted_key_is_hedged_under_any_setting() {
    let server = FaultServer::start().await;
    let EagerPolicies {
        plain,
        learned: learned_policy,
        other_host,
        minted_untrusted,
        trusted_but_off,
        route_then_marker,
    } = eager_policies();
    type Tweak = fn(&mut Request<Full<Bytes>>);
    let key: Tweak = |r| {
        r.headers_mut()
            .insert("idempotency-key", "\"key-1\"".parse().unwrap());
    };
    let none: Tweak = |_| {};
    let cases: Vec<(&str, &RetryPolicy, Method, Tweak)> = vec![
        ("post", &plain, Method::POST, none),
        ("patch", &plain, Method::PATCH, none),
        ("post-untrusted-key", &plain, Method::POST, key),
        ("post-key-other-host", &other_host, Method::POST, key),
        (
            "post-minted-untrusted",
            &minted_untrusted,
            Method::POST,
            none,
        ),
        (
            "post-trusted-key-hedging-off",
            &trusted_but_off,
            Method::POST,
            key,
        ),
        ("route-marker", &route_then_marker, Method::POST, |r| {
            r.extensions_mut().insert(Idempotency::NonIdempotent);
        }),
        ("put-marked-write", &plain, Method::PUT, |r| {
            r.extensions_mut().insert(Idempotency::NonIdempotent);
        }),
        ("get-no-retry", &plain, Method::GET, |r| {
            r.extensions_mut().insert(NoRetry);
        }),
        ("post-options", &plain, Method::POST, |r| {
            r.extensions_mut()
                .insert(RequestOptions::new().max_retries(10));
        }),
        ("post-learned", &learned_policy, Method::POST, none),
    ];
    for (op, policy, method, tweak) in cases {
        // Fill the hedge budget (and teach the learned delay) with fast reads.
        for i in 0..10 {
            let warm = loopback_req(&server, Method::GET, &format!("warm-{op}-{i}"), 0);
            send(policy, warm).await.unwrap();
        }
        let mut req = loopback_req(&server, method.clone(), op, 200);
        tweak(&mut req);
        let (res, r) = send(policy, req).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{op}");
        assert_eq!(
            (server.stats(op).attempts, r.hedges(), r.attempts()),
            (1, 0, 1),
            "{op} ({method}) was sent twice"
        );
    }
    // The control: a slow read under the same settings is hedged.
    let (_, r) = send(&plain, loopback_req(&server, Method::GET, "control", 200))
        .await
        .unwrap();
    let sent = server.stats("control").attempts;
    assert!(sent >= 2 && r.hedges() >= 1, "{sent} sends, {r}");
}

/// The most eager hedging settings, each of which must still never hedge a write that has no
/// key its target is trusted to honour.
struct EagerPolicies {
    plain: RetryPolicy,
    learned: RetryPolicy,
    other_host: RetryPolicy,
    minted_untrusted: RetryPolicy,
    trusted_but_off: RetryPolicy,
    route_then_marker: RetryPolicy,
}

fn eager_policies() -> EagerPolicies {
    let learned_hedge = Hedge::learned()
        .min_samples(1)
        .max_extra_load(1.0)
        .max_hedges(10)
        .keyed_writes(true);
    let plain = hedging(eager()).build().unwrap();
    let learned = hedging(learned_hedge).build().unwrap();
    let other_host = hedging(eager())
        .honor_idempotency_key_for_host("other.example")
        .build()
        .unwrap();
    // Minting with no host named trusts every target (documented); with a host named, the
    // key minted for another target is not trusted.
    let minted_untrusted = hedging(eager())
        .mint_idempotency_keys(true)
        .honor_idempotency_key_for_host("other.example")
        .build()
        .unwrap();
    let trusted_but_off = hedging(
        Hedge::fixed(Duration::from_millis(20))
            .max_extra_load(1.0)
            .max_hedges(10),
    )
    .honor_idempotency_key(true)
    .build()
    .unwrap();
    let route_then_marker = hedging(eager())
        .route(Method::POST, "/ops/route-marker", Idempotency::Idempotent)
        .build()
        .unwrap();

    EagerPolicies {
        plain,
        learned,
        other_host,
        minted_untrusted,
        trusted_but_off,
        route_then_marker,
    }
}

/// A streaming (recorded) body is never hedged through the tower layer, even on an
/// idempotent PUT, nor one past the replay buffer: one send each, though 10× the delay; the
/// same client does hedge a slow GET (control).
///
/// Found by the adversarial review of safe hedging and the per-attempt spans (issue 25).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tower_never_hedges_a_streaming_body() {
    type Streamed = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;
    let server = FaultServer::start().await;
    let streamed = |method: Method, op: &str| {
        Request::builder()
            .method(method)
            .uri(server.url(op))
            .header("x-handler-delay-ms", "200")
            .body(Full::new(Bytes::from_static(b"{\"amount\":1}")).boxed())
            .unwrap()
    };
    for buffer in [64 * 1024, 4] {
        let policy = hedging(eager()).replay_buffer(buffer).build().unwrap();
        let client: Client<HttpConnector, Streamed> =
            Client::builder(TokioExecutor::new()).build_http();
        let svc = policy.layer(client);
        for i in 0..10 {
            let warm = Request::get(server.url(&format!("warm-s{buffer}-{i}")))
                .body(Streamed::default())
                .unwrap();
            svc.clone().oneshot(warm).await.unwrap();
        }
        let op = format!("put-stream-{buffer}");
        let res = svc
            .clone()
            .oneshot(streamed(Method::PUT, &op))
            .await
            .unwrap();
        let r = RetryReport::of(&res).cloned().unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(
            (server.stats(&op).attempts, server.applied(&op), r.hedges()),
            (1, 1, 0),
            "buffer {buffer}"
        );
    }
}

/// The reqwest adapter never hedges a write without a trusted key, nor a streaming body
/// (even an idempotent PUT): one send each, though slow; a slow GET is hedged (control).
///
/// Found by the adversarial review of safe hedging and the per-attempt spans (issue 25).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reqwest_never_hedges_writes_or_streams() {
    use tower_retry_safety::RetrySafetyMiddleware;
    let server = FaultServer::start().await;
    let policy = RetryPolicy::builder()
        .honor_idempotency_key_for_host("other.example")
        .hedge(eager())
        .max_retries(10)
        .no_budget()
        .build()
        .unwrap();
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetrySafetyMiddleware::new(policy))
        .build();
    for i in 0..10 {
        client
            .get(server.url(&format!("warm{i}")))
            .send()
            .await
            .unwrap();
    }
    let slow = |b: reqwest_middleware::RequestBuilder| b.header("x-handler-delay-ms", "200");
    let res = slow(client.post(server.url("r-post")))
        .header("idempotency-key", "\"k\"")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(RetryReport::of_reqwest(&res).unwrap().hedges(), 0);
    let res = slow(client.patch(server.url("r-patch")))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(RetryReport::of_reqwest(&res).unwrap().hedges(), 0);
    let stream =
        futures_util::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from_static(b"{}"))]);
    let res = slow(client.put(server.url("r-put-stream")))
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        [
            server.stats("r-post").attempts,
            server.stats("r-patch").attempts,
            server.stats("r-put-stream").attempts,
            server.applied("r-put-stream"),
        ],
        [1, 1, 1, 1]
    );
    slow(client.get(server.url("r-control")))
        .send()
        .await
        .unwrap();
    assert!(server.stats("r-control").attempts >= 2);
}
