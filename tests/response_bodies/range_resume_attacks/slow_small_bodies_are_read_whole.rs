//! A small body read inside the attempt: slow but healthy, it is read whole in one request
//! (tower, reqwest, a keyed write), never turned into a failure; cut or stalled, it is read again;
//! the deadline stays absolute; a write keeps its response; a body in many small frames cut late
//! is recovered.
//!
//! Found by the adversarial review of reading whole bodies (issue 23).

use std::time::Duration;

use super::{policy, req};
use crate::read_whole_reqwest::reqwest_client;
use bytes::Bytes;
use http::Method;
use http_body_util::Full;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use retry_safety_testing::cut_server::{Cut, CutServer, Options};
use retry_safety_testing::raw_server::rep;
use retry_safety_testing::read_whole::{find_cut, read_all, stack};
use tower::{ServiceBuilder, ServiceExt};
use tower_retry_safety::RetryReport;

/// A body within the limit that arrives in more than 1024 frames (a server that writes small
/// pieces: here 60000 bytes in 50-byte writes, 1 ms apart), cut near its end.
///
/// What happens: `Reading::poll_read` stops at `MAX_FRAMES` (1024) and hands the rest on
/// with `whole.then(rest)`, without a `Resume` and without any mark: the retry layer has
/// already decided the attempt was a plain `200`. The cut after 59000 bytes then ends the
/// caller's body in a `BodyCutError` (why_no_resume `None`), for a `GET` that was both
/// re-readable and resumable: 1 request, 0 range requests, the read not recovered.
///
/// Fix: count bytes, not frames, for memory (the limit already bounds it); or, at
/// `MAX_FRAMES`, hand the rest on as a streamed body with the same `Resume` the past-the-limit
/// path builds (`streamed(...)`, with the bytes read so far as `received`).
///
/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn a_small_body_in_many_frames_cut_late_is_recovered() {
    let body = Bytes::from(rep(60_000, 1));
    let mut options = Options::new(body.clone());
    options.frame = 50;
    options.pace = Some(Duration::from_millis(1));
    let server = CutServer::start(options, vec![Cut::At(59_000)]).await;
    let res = stack(policy().build().unwrap())
        .oneshot(req(Method::GET, &server.url("/f"), None))
        .await
        .unwrap();
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(
        err.is_none(),
        "not recovered: {err:?} after {} bytes",
        bytes.len()
    );
    assert_eq!(bytes, body);
}

/// A small body that arrives slowly but whole: 8 KiB in 512-byte frames 60 ms apart (about
/// 0.9 s), and a per-attempt timeout of 300 ms (which, without the layer, bounds the wait for
/// the head only).
async fn slow_small_body() -> (CutServer, Bytes) {
    let body = Bytes::from(rep(8 * 1024, 1));
    let mut options = Options::new(body.clone());
    options.frame = 512;
    options.pace = Some(Duration::from_millis(60));
    (CutServer::start(options, vec![]).await, body)
}

/// A `GET` whose small body is slow but never cut.
///
/// What happened: without `ReadWholeLayer` the read succeeds (1 request, whole body). With it,
/// the body was read inside the attempt, and the retry layer's per-attempt timer
/// (`attempt_timeout`) bounded the whole reading, not each wait for a frame: every attempt was
/// cut at 300 ms, read again, cut again, until retries were used up (6 requests for
/// `max_retries(5)`), and the caller got an error for a read that was healthy.
///
/// Fixed: the retry layer tells the attempt when its clock ends (`AttemptEnds`); when the body
/// is still coming then, `ReadWhole` hands what it read and the rest on as a stream (which the
/// per-attempt timeout then bounds frame by frame, and which resumes with `Range` if cut).
///
/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn a_slow_but_healthy_small_get_body_is_not_turned_into_a_failure() {
    let (server, body) = slow_small_body().await;
    let policy = policy()
        .attempt_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    // Without the layer: whole.
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let plain = ServiceBuilder::new().layer(policy.clone()).service(client);
    let res = plain
        .oneshot(req(Method::GET, &server.url("/a"), None))
        .await
        .unwrap();
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(err.is_none());
    assert_eq!(bytes, body);
    assert_eq!(server.requests(), 1);
    // With it.
    let out = stack(policy)
        .oneshot(req(Method::GET, &server.url("/b"), None))
        .await;
    let requests = server.requests() - 1;
    let res = out.unwrap_or_else(|e| panic!("{requests} requests, then {e}"));
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(bytes, body);
    assert_eq!(requests, 1);
}

/// The same slow body through the reqwest adapter: read whole, one request.
///
/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn reqwest_a_slow_but_healthy_small_get_body_is_read_whole() {
    let (server, body) = slow_small_body().await;
    let policy = policy()
        .attempt_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let res = reqwest_client(policy)
        .get(server.url("/a"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{} requests, then {e}", server.requests()));
    let bytes = res.bytes().await.expect("whole");
    assert_eq!(bytes, body);
    assert_eq!(server.requests(), 1);
}

/// A keyed `POST` whose small body is slow: read inside the attempt (a repeat would be
/// harmless), handed on when the attempt's clock runs out, and never sent again.
///
/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn a_keyed_write_whose_small_body_is_slow_is_sent_once_and_read_whole() {
    let (server, body) = slow_small_body().await;
    let policy = policy()
        .attempt_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let res = stack(policy)
        .oneshot(req(Method::POST, &server.url("/v1/send"), Some("k-slow-1")))
        .await
        .unwrap_or_else(|e| panic!("{} requests, then {e}", server.requests()));
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(bytes, body);
    assert_eq!(server.requests(), 1);
    assert_eq!(server.applied(), 1);
}

/// A slow small body cut mid-way: the attempt failed after the server answered, and the body
/// is read again whole (no range request within the limit), however slowly each attempt came.
///
/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn a_slow_small_body_cut_mid_way_is_read_again_whole() {
    let body = Bytes::from(rep(8 * 1024, 3));
    let mut options = Options::new(body.clone());
    options.frame = 512;
    options.pace = Some(Duration::from_millis(60));
    // Past the 300 ms of the per-attempt timeout (about 5 frames), before the end.
    let server = CutServer::start(options, vec![Cut::At(6 * 1024)]).await;
    let policy = policy()
        .attempt_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let res = stack(policy)
        .oneshot(req(Method::GET, &server.url("/f"), None))
        .await
        .unwrap_or_else(|e| panic!("{} requests, then {e}", server.requests()));
    let report = RetryReport::of(&res).expect("a report").clone();
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(bytes, body);
    assert_eq!(server.requests(), 2);
    assert_eq!(server.range_requests(), 0);
    assert_eq!(report.attempts(), 2);
    let first = report.attempt_outcomes().next().expect("a record");
    assert_eq!(first.body_cut_after(), Some(6 * 1024));
}

/// A small body that stalls for good after some frames: a wait for a frame longer than the
/// per-attempt timeout is a cut, and the body is read again.
///
/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn a_small_body_that_stalls_after_slow_frames_is_read_again() {
    let body = Bytes::from(rep(8 * 1024, 4));
    let mut options = Options::new(body.clone());
    options.frame = 512;
    options.pace = Some(Duration::from_millis(60));
    let server = CutServer::start(options, vec![Cut::StallAt(6 * 1024)]).await;
    let policy = policy()
        .attempt_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let res = stack(policy)
        .oneshot(req(Method::GET, &server.url("/f"), None))
        .await
        .unwrap_or_else(|e| panic!("{} requests, then {e}", server.requests()));
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(bytes, body);
    assert_eq!(server.requests(), 2);
}

/// The deadline stays absolute while a slow body is read inside the attempt: cut at the
/// deadline, not sent again, and the error says the deadline ended it.
///
/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn a_slow_small_body_is_cut_by_the_deadline() {
    let (server, _) = slow_small_body().await;
    let policy = policy()
        .attempt_timeout(Duration::from_millis(300))
        .deadline(Duration::from_millis(450))
        .build()
        .unwrap();
    let out = stack(policy)
        .oneshot(req(Method::GET, &server.url("/a"), None))
        .await;
    let err = out.expect_err("the deadline passed while the body was read");
    assert!(err.to_string().contains("deadline"), "{err}");
    assert_eq!(server.requests(), 1);
}

/// An unkeyed `POST` whose small response body is slow but never cut (or stalls).
///
/// What happens: the server applies the write and answers `200` with a 8 KiB body that takes
/// about 0.9 s. Without the layer, the caller gets the response and its whole body. With it,
/// the per-attempt timer (300 ms) fires while the body is read inside the attempt; the write
/// is (rightly) not sent again, but the caller gets `Err(Error)` — ambiguous, "may have been
/// applied" — instead of the response: the status the server answered (and the body that was
/// still coming) is lost, though the README promises that for a write without a trusted key
/// "the caller has the response, and its body ends in a BodyCutError saying that the server had
/// answered (its status)". 1 request, 1 write (never twice holds).
///
/// Fix: read inside the attempt only a request the retry layer may repeat (the retry layer
/// marks the attempt's extensions when `Plan::may_retry`, and ReadWhole streams the others
/// untouched), or, when the attempt's clock runs out while ReadWhole is reading, return the
/// response with its body ending in a `BodyCutError` rather than the error.
///
/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn a_write_whose_small_body_is_slow_keeps_its_response() {
    let (server, body) = slow_small_body().await;
    let policy = policy()
        .attempt_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let out = stack(policy)
        .oneshot(req(Method::POST, &server.url("/v1/send"), None))
        .await;
    assert_eq!(server.requests(), 1);
    assert_eq!(server.applied(), 1);
    let res = out.unwrap_or_else(|e| panic!("the response was lost: {e}"));
    let (bytes, err) = read_all(res.into_body()).await;
    // Whole, or a prefix ending in a BodyCutError with the status.
    match err {
        None => assert_eq!(bytes, body),
        Some(err) => assert!(find_cut(&*err).is_some(), "{err:?}"),
    }
}
