//! Keyed writes whose response body is longer than the read-whole limit and is cut while it
//! streams to the caller: sent again whole with the same key, the server's stored response continues the
//! body where the cut left it (the bytes already delivered are skipped), through both front
//! ends, against a real hyper server on loopback whose `POST`s are behind the crate's
//! `IdempotencyLayer` (the cut is between the network and that layer, after the handler ran).
//! A stored response that is not the same response, a key the policy does not trust, and a write without
//! a key are never spliced or never sent again.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use reqwest_middleware::ClientBuilder;
use retry_safety_testing::cut_server::{Cut, CutServer, Options};
use retry_safety_testing::read_whole::{find_cut, policy, read_all, representation, stack};
use tower::{ServiceBuilder, ServiceExt};
use tower_retry_safety::resume::{
    BodyReport, NoResume, ReadWholeLayer, ReadWholeMiddleware, WholeBody,
};
use tower_retry_safety::{RetryPolicy, RetryReport, RetrySafetyMiddleware};

/// Past this, a body streams to the caller (the server keeps responses up to 64 KiB whole).
const LIMIT: u64 = 16 * 1024;
const LEN: usize = 40 * 1024;
const CUT: usize = 24 * 1024;

fn post(url: &str, key: Option<&str>) -> Request<Full<Bytes>> {
    let mut req = Request::builder().method(Method::POST).uri(url);
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    req.body(Full::new(Bytes::from_static(b"{\"to\":\"a@example.com\"}")))
        .unwrap()
}

async fn send_tower(
    server: &CutServer,
    policy: RetryPolicy,
    key: Option<&str>,
) -> http::Response<WholeBody<hyper::body::Incoming>> {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    ServiceBuilder::new()
        .layer(policy)
        .layer(ReadWholeLayer::new().limit(LIMIT))
        .service(client)
        .oneshot(post(&server.url("/v1/messages"), key))
        .await
        .expect("the head arrives whole")
}

#[tokio::test]
async fn a_keyed_write_cut_past_the_limit_continues_with_the_servers_stored_response() {
    let body = representation(LEN);
    let server = CutServer::start_with_keys(Options::new(body.clone()), vec![Cut::At(CUT)]).await;
    let policy = policy().honor_idempotency_key(true).build().unwrap();
    let res = send_tower(&server, policy, Some("key-past-1")).await;
    assert_eq!(RetryReport::of(&res).expect("report").attempts(), 1);
    let handle = BodyReport::of(&res)
        .cloned()
        .expect("a body that may resume");
    let mut whole = res.into_body();
    let (bytes, err) = read_all(&mut whole).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(bytes, body);
    // Sent twice, applied once: the second answer is the stored response, sent whole.
    assert_eq!(server.requests(), 2);
    assert_eq!(server.applied(), 1);
    assert_eq!(server.range_requests(), 0);
    assert_eq!(server.body_bytes(), (CUT + LEN) as u64);
    assert_eq!(whole.resumes(), 1);
    let report = handle.get().expect("the cut was decided on");
    assert_eq!(report.attempts(), 2);
    assert_eq!(report.idempotency_key(), Some("key-past-1"));
    let first = report.attempt_outcomes().next().expect("a record");
    assert_eq!(first.body_cut_after(), Some(CUT as u64));
}

#[tokio::test]
async fn reqwest_a_keyed_write_cut_past_the_limit_continues_with_the_servers_stored_response() {
    let body = representation(LEN);
    let server = CutServer::start_with_keys(Options::new(body.clone()), vec![Cut::At(CUT)]).await;
    let policy = policy().honor_idempotency_key(true).build().unwrap();
    let client = reqwest::Client::new();
    let client = ClientBuilder::new(client.clone())
        .with(RetrySafetyMiddleware::new(policy))
        .with(ReadWholeMiddleware::new().limit(LIMIT).resume_with(client))
        .build();
    let res = client
        .post(server.url("/v1/messages"))
        .header("idempotency-key", "key-past-2")
        .body("{\"to\":\"a@example.com\"}")
        .send()
        .await
        .expect("the head arrives whole");
    let handle = BodyReport::of_reqwest(&res)
        .cloned()
        .expect("a body report");
    let bytes = res.bytes().await.expect("continued");
    assert_eq!(bytes, body);
    assert_eq!(server.requests(), 2);
    assert_eq!(server.applied(), 1);
    assert_eq!(handle.get().expect("the cut was decided on").attempts(), 2);
}

/// The server kept the response without its body (longer than its 64 KiB): the replay is
/// empty, not the same response, so nothing is spliced and the body ends in the error.
#[tokio::test]
async fn a_stored_response_without_the_body_is_never_spliced() {
    let len = 80 * 1024;
    let body = representation(len);
    let server = CutServer::start_with_keys(Options::new(body.clone()), vec![Cut::At(CUT)]).await;
    let policy = policy().honor_idempotency_key(true).build().unwrap();
    let res = send_tower(&server, policy, Some("key-past-3")).await;
    let (bytes, err) = read_all(res.into_body()).await;
    assert_eq!(bytes, body[..CUT]);
    let err = err.expect("the body ends in the error");
    let cut = find_cut(&*err).expect("a BodyCutError in the chain");
    assert_eq!(cut.why_no_resume(), Some(NoResume::NotTheSame));
    assert_eq!(cut.bytes_received(), CUT as u64);
    assert_eq!(server.requests(), 2);
    assert_eq!(server.applied(), 1);
}

/// A key the policy does not trust does not make the write safe to repeat: sent once.
#[tokio::test]
async fn a_keyed_write_without_trust_is_sent_once() {
    let body = representation(LEN);
    let server = CutServer::start_with_keys(Options::new(body.clone()), vec![Cut::At(CUT)]).await;
    let policy = policy().build().unwrap();
    let res = send_tower(&server, policy, Some("key-past-4")).await;
    let (bytes, err) = read_all(res.into_body()).await;
    assert_eq!(bytes, body[..CUT]);
    let err = err.expect("the body ends in the error");
    let cut = find_cut(&*err).expect("a BodyCutError in the chain");
    assert_eq!(cut.why_no_resume(), Some(NoResume::NotRepeatable));
    assert_eq!(server.requests(), 1);
    assert_eq!(server.applied(), 1);
}

/// A write without a key: sent once, whatever the policy trusts.
#[tokio::test]
async fn a_write_without_a_key_is_sent_once() {
    let body = representation(LEN);
    let server = CutServer::start_with_keys(Options::new(body.clone()), vec![Cut::At(CUT)]).await;
    let policy = policy().honor_idempotency_key(true).build().unwrap();
    let res = send_tower(&server, policy, None).await;
    let (bytes, err) = read_all(res.into_body()).await;
    assert_eq!(bytes, body[..CUT]);
    let err = err.expect("the body ends in the error");
    let cut = find_cut(&*err).expect("a BodyCutError in the chain");
    assert_eq!(cut.why_no_resume(), Some(NoResume::NotRepeatable));
    assert_eq!(server.requests(), 1);
    assert_eq!(server.applied(), 1);
}

/// A keyed write within the limit whose body is cut is sent again with its key; the second
/// answer is the server's stored response, read whole. Moved here from the client's
/// tests/response_bodies/read_whole.rs.
#[tokio::test]
async fn a_keyed_post_whose_body_was_cut_is_sent_again_with_the_same_key() {
    let body = representation(16 * 1024);
    let server =
        CutServer::start_with_keys(Options::new(body.clone()), vec![Cut::At(8 * 1024)]).await;
    let policy = policy().honor_idempotency_key(true).build().unwrap();
    let res = stack(policy)
        .oneshot(post(&server.url("/v1/messages"), Some("key-1")))
        .await
        .expect("answered");
    let report = RetryReport::of(&res).expect("report").clone();
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(bytes, body);
    assert_eq!(server.requests(), 2);
    // The handler ran once: the second answer is the server's stored response.
    assert_eq!(server.applied(), 1);
    assert_eq!(server.body_bytes(), 8 * 1024 + 16 * 1024);
    assert_eq!(report.attempts(), 2);
    assert_eq!(report.idempotency_key(), Some("key-1"));
    assert_eq!(
        report.attempt_outcomes().next().unwrap().body_cut_after(),
        Some(8 * 1024)
    );
}

/// The same through `RetrySafetyMiddleware` and `ReadWholeMiddleware`. Moved here from the
/// client's tests/reqwest/read_whole.rs.
#[tokio::test]
async fn reqwest_a_keyed_post_whose_body_was_cut_is_sent_again_with_the_same_key() {
    let body = representation(16 * 1024);
    let server =
        CutServer::start_with_keys(Options::new(body.clone()), vec![Cut::At(8 * 1024)]).await;
    let policy = policy().honor_idempotency_key(true).build().unwrap();
    let client = reqwest::Client::new();
    let client = ClientBuilder::new(client.clone())
        .with(RetrySafetyMiddleware::new(policy))
        .with(ReadWholeMiddleware::new().resume_with(client))
        .build();
    let res = client
        .post(server.url("/v1/messages"))
        .header("idempotency-key", "key-1")
        .body("{}")
        .send()
        .await
        .expect("answered");
    let report = RetryReport::of_reqwest(&res).expect("report").clone();
    let bytes = res.bytes().await.expect("read whole");
    assert_eq!(bytes, body);
    assert_eq!(report.attempts(), 2);
    assert_eq!(server.requests(), 2);
    assert_eq!(server.applied(), 1);
}

/// Within the read-whole limit (the server keeps responses up to 64 KiB whole).
const SMALL: usize = 8 * 1024;
/// Every call ends within this long, or the test fails (a hang is a defect).
const HANG: Duration = Duration::from_secs(20);

/// Against the crate's own server: a keyed write within the limit whose body stalls (the
/// handler ran, its response was stored) is cut by the per-frame wait and sent again with its
/// key; the stored response is read whole. 2 requests, 1 write applied.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23); moved here from
/// the client's tests/response_bodies/attempt_clock/writes_never_repeated_are_sent_once.rs.
#[tokio::test]
async fn a_keyed_write_within_the_limit_that_stalls_is_resent_once() {
    let body = representation(SMALL);
    let server =
        CutServer::start_with_keys(Options::new(body.clone()), vec![Cut::StallAt(SMALL / 2)]).await;
    let policy = policy()
        .honor_idempotency_key(true)
        .attempt_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let out = tokio::time::timeout(
        HANG,
        stack(policy).oneshot(post(&server.url("/v1/messages"), Some("k-5"))),
    )
    .await
    .expect("no hang");
    let res = out.expect("answered");
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(bytes, body);
    assert_eq!(server.requests(), 2);
    assert_eq!(server.applied(), 1);
}
