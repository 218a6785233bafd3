//! Never twice: a write whose response body is cut is sent once (unkeyed, or keyed without
//! trust, through tower and reqwest; sent again only with a trusted key, and then never spliced
//! onto another response), a `GET` marked `NoRetry` or that a route calls a write is one attempt,
//! and a write that stalls past the attempt timeout is sent once and keeps its response.
//!
//! Found by the adversarial review of reading whole bodies (issue 23).

use std::time::Duration;

use super::{cut_write, policy, req};
use crate::read_whole_reqwest::{reqwest_client, reqwest_read_all, BIG, HALF};
use http::Method;
use retry_safety_testing::raw_server::{cl, head, rep, Act, Raw};
use retry_safety_testing::read_whole::{find_cut, read_all, stack};
use tower::ServiceExt;
use tower_retry_safety::resume::NoResume;
use tower_retry_safety::{NoRetry, RetryPolicy, RetryReport};

/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn unkeyed_writes_whose_body_is_cut_are_sent_once_tower() {
    for method in [Method::POST, Method::PATCH] {
        for (len, at, chunk) in [
            (1000, 0, false),
            (1000, 1, false),
            (1000, 999, false),
            (64 * 1024, 64 * 1024 - 1, false),
            (BIG, HALF, false),
            (1000, 500, true),
            (BIG, 1, true),
        ] {
            let server = Raw::start(cut_write(len, at, chunk)).await;
            let res = stack(policy().build().unwrap())
                .oneshot(req(method.clone(), &server.url("/v1/send?x=1"), None))
                .await
                .expect("the server answered");
            let report = RetryReport::of(&res).unwrap().clone();
            let (bytes, err) = read_all(res.into_body()).await;
            let err = err.unwrap_or_else(|| {
                panic!("the body ends in an error: {method} {len} {at} {chunk}")
            });
            let cut = find_cut(&*err).expect("a BodyCutError");
            assert_eq!(
                cut.bytes_received(),
                at as u64,
                "{method} {len} {at} {chunk}"
            );
            assert_eq!(bytes.len(), at);
            assert_eq!(server.writes(), 1, "{method} {len} {at} {chunk}");
            assert_eq!(server.requests(), 1);
            assert_eq!(report.attempts(), 1);
            assert!(report.may_have_been_applied());
        }
    }
}

/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn keyed_writes_without_trust_are_sent_once_tower() {
    let policies = [
        ("no trust", policy().build().unwrap()),
        (
            "trust for another host",
            policy()
                .honor_idempotency_key_for_host("api.example.com")
                .build()
                .unwrap(),
        ),
        (
            "route says the endpoint ignores keys",
            policy()
                .honor_idempotency_key(true)
                .route_honors_idempotency_key(Method::POST, "/v1/send", false)
                .build()
                .unwrap(),
        ),
    ];
    for (what, policy) in policies {
        for (len, at) in [(1000, 500), (BIG, HALF)] {
            let server = Raw::start(cut_write(len, at, false)).await;
            let res = stack(policy.clone())
                .oneshot(req(Method::POST, &server.url("/v1/send"), Some("\"k-1\"")))
                .await
                .expect("the server answered");
            let (_, err) = read_all(res.into_body()).await;
            assert!(err.is_some(), "{what}");
            assert_eq!(server.writes(), 1, "{what} {len}");
        }
    }
    // With trust, the keyed write within the limit is sent again (the server would send its stored response).
    let server = Raw::start(cut_write(1000, 500, false)).await;
    let policy = policy()
        .honor_idempotency_key(true)
        .max_retries(1)
        .build()
        .unwrap();
    let res = stack(policy)
        .oneshot(req(Method::POST, &server.url("/v1/send"), Some("\"k-1\"")))
        .await
        .unwrap();
    let _ = read_all(res.into_body()).await;
    assert_eq!(server.writes(), 2);
    // Past the limit too, sent again whole with its key (never with `Range`), and spliced only
    // onto the server's stored response: this server does not honour keys (it applies the write again
    // and marks no stored response), so the body ends in the error and nothing is spliced.
    let server = Raw::start(cut_write(BIG, HALF, false)).await;
    let policy = RetryPolicy::builder()
        .honor_idempotency_key(true)
        .no_budget()
        .build()
        .unwrap();
    let res = stack(policy)
        .oneshot(req(Method::POST, &server.url("/v1/send"), Some("\"k-1\"")))
        .await
        .unwrap();
    let (bytes, err) = read_all(res.into_body()).await;
    assert_eq!(bytes.len(), HALF);
    let err = err.expect("not the same response: the body ends in the error");
    let cut = find_cut(&*err).expect("a BodyCutError");
    assert_eq!(cut.why_no_resume(), Some(NoResume::NotTheSame));
    assert_eq!(server.writes(), 2);
    assert_eq!(server.ranges(), 0);
}

/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn a_no_retry_get_is_one_attempt_within_and_past_the_limit() {
    for (len, at) in [(1000, 500), (BIG, HALF)] {
        let server = Raw::start(cut_write(len, at, false)).await;
        let mut r = req(Method::GET, &server.url("/f"), None);
        r.extensions_mut().insert(NoRetry);
        let res = stack(policy().build().unwrap()).oneshot(r).await.unwrap();
        let (_, err) = read_all(res.into_body()).await;
        let err = err.expect("cut");
        let cut = find_cut(&*err).unwrap();
        if len == BIG {
            assert_eq!(cut.why_no_resume(), Some(NoResume::NotRepeatable));
        }
        assert_eq!(server.requests(), 1, "{len}");
        assert_eq!(server.ranges(), 0);
    }
}

/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn unkeyed_writes_whose_body_is_cut_are_sent_once_reqwest() {
    for method in [Method::POST, Method::PATCH] {
        for (len, at, chunk) in [
            (1000, 0, false),
            (1000, 999, false),
            (BIG, HALF, false),
            (1000, 500, true),
        ] {
            let server = Raw::start(cut_write(len, at, chunk)).await;
            let client = reqwest_client(policy().build().unwrap());
            let res = client
                .request(method.clone(), server.url("/v1/send"))
                .header("idempotency-key", "\"k-1\"")
                .body("{}")
                .send()
                .await
                .expect("the server answered");
            let (bytes, err) = reqwest_read_all(res).await;
            let err = err.expect("cut");
            let cut = find_cut(&err).expect("a BodyCutError");
            assert_eq!(cut.bytes_received(), at as u64);
            assert_eq!(bytes.len(), at);
            assert_eq!(server.writes(), 1, "{method} {len} {at} {chunk}");
        }
    }
}

/// A `GET` that a route rule calls a write is never read again nor resumed, in either front end.
///
/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn a_get_a_route_calls_non_idempotent_is_one_attempt() {
    let policy = || {
        policy()
            .route(
                Method::GET,
                "/v1/trigger",
                tower_retry_safety::Idempotency::NonIdempotent,
            )
            .build()
            .unwrap()
    };
    for (len, at) in [(1000, 500), (BIG, HALF)] {
        let server = Raw::start(cut_write(len, at, false)).await;
        let res = stack(policy())
            .oneshot(req(Method::GET, &server.url("/v1/trigger"), None))
            .await
            .unwrap();
        let (_, err) = read_all(res.into_body()).await;
        assert!(find_cut(&*err.expect("cut")).is_some());
        let res = reqwest_client(policy())
            .get(server.url("/v1/trigger"))
            .send()
            .await
            .unwrap();
        let (_, err) = reqwest_read_all(res).await;
        assert!(find_cut(&err.expect("cut")).is_some());
        assert_eq!(server.requests(), 2, "{len}");
        assert_eq!(server.ranges(), 0);
    }
}

/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn a_no_retry_get_is_one_attempt_reqwest() {
    for (len, at) in [(1000, 500), (BIG, HALF)] {
        let server = Raw::start(cut_write(len, at, false)).await;
        let res = reqwest_client(policy().build().unwrap())
            .get(server.url("/f"))
            .with_extension(NoRetry)
            .send()
            .await
            .unwrap();
        let (_, err) = reqwest_read_all(res).await;
        assert!(find_cut(&err.expect("cut")).is_some());
        assert_eq!(server.requests(), 1, "{len}");
        assert_eq!(server.ranges(), 0);
    }
}

/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn a_write_that_stalls_past_the_attempt_timeout_within_the_limit_is_sent_once() {
    let server = Raw::start(|_, _| {
        vec![
            Act::W(head("200 OK", &[cl(1000)])),
            Act::W(rep(400, 1)),
            Act::Pause(5_000),
        ]
    })
    .await;
    let policy = policy()
        .attempt_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    // A write nothing makes safe to repeat streams its body (it is never read inside the
    // attempt): the caller gets the response, and the request went out once.
    let res = stack(policy)
        .oneshot(req(Method::POST, &server.url("/v1/send"), None))
        .await
        .expect("the server answered");
    assert_eq!(res.status(), http::StatusCode::OK);
    assert_eq!(server.writes(), 1);
}
