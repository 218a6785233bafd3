//! Adversarial review, round 2 of issue 23 (commits b64e83c, 70a9b8b, 17d638c): the attempt's
//! clock (`AttemptClock`: the per-attempt timeout bounds each wait for a frame of a body read
//! inside the attempt), keyed writes past the read limit (sent again with their key, spliced only
//! onto the server's replay of the same response), and the reports (`BodyReport`,
//! `BodyCutError::report`).
//!
//! Real sockets on 127.0.0.1: a scripted raw HTTP/1.1 server (`Raw`, first written for
//! `review_read_whole.rs`) that counts requests and writes (every `POST`/`PATCH` it reads is a
//! write applied: it does not honour keys unless a script replays), and the crate's own
//! `IdempotencyLayer` behind `CutServer::start_with_keys`. Timing logic that must be exact (a head
//! at the very instant the timer fires, a body that trickles forever) runs on paused tokio time
//! against an in-memory service. Hangs are turned into failures with `tokio::time::timeout`.
//!
//! The six defects this round found are fixed, and their tests run (each failed before its
//! fix; each doc comment says what happened and the fix):
//!
//! - splice: `a_replayed_503_cut_then_an_unmarked_503_is_never_spliced` (and its reqwest twin):
//!   a stale `StopReason::StoredResponse` made an unmarked resend count as the server's replay; the
//!   replay mark is now read on each answer's own headers;
//! - hang: `a_stall_past_the_limit_that_cannot_resume_is_cut_by_the_per_attempt_timeout` (a
//!   streamed body without a `Resume` had no clock) and
//!   `paused_many_empty_frames_then_a_stall_is_still_cut` (the rest after 1024 empty frames):
//!   such a body now has the attempt's clock (`FrameClock`);
//! - weaker: `a_write_that_is_never_repeated_keeps_its_response_under_the_deadline` (a write
//!   with an untrusted key was read inside the attempt: the retry layer now says, with the
//!   attempt's clock, whether the attempt could be followed by another) and
//!   `a_keyed_write_with_the_policys_own_key_header_is_recovered_past_the_limit` (the header
//!   name was hard-coded in `ReadWhole`: the retry layer now names a key header that is not
//!   the default, `KeyHeader`).

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use crate::support::cut_server::{Cut, CutServer, Options};
use crate::support::raw_server::{cl, head, rep, Act, Raw};
use bytes::Bytes;
use http::{HeaderName, Method, Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use tower::buffer::BufferLayer;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_retry_safety::resume::{BodyCutError, BodyReport, NoResume};
use tower_retry_safety::{
    NoRetry, ReadWholeLayer, ReadWholeMiddleware, RetryPolicy, RetryReport, RetrySafetyMiddleware,
    StopReason, WholeBody,
};

type Incoming = hyper::body::Incoming;

// ---------------------------------------------------------------------------------------------
// Stacks, bodies and checks.
// ---------------------------------------------------------------------------------------------

const BIG: usize = 200_000; // past the 64 KiB limit
const HALF: usize = 100_000;
const SMALL: usize = 8 * 1024; // within the limit
/// Longer than any test runs: a body that stalls "forever".
const FOREVER_MS: u64 = 600_000;
/// A read that takes longer than this hangs (real time, generous on a loaded machine).
const HANG: Duration = Duration::from_secs(20);

fn policy() -> tower_retry_safety::RetryPolicyBuilder {
    RetryPolicy::builder()
        .max_retries(3)
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .no_budget()
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

fn stack(
    policy: RetryPolicy,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<WholeBody<Incoming>>,
    Error = tower_retry_safety::Error,
> + Clone {
    ServiceBuilder::new()
        .layer(policy)
        .layer(ReadWholeLayer::new())
        .service(client())
}

fn reqwest_client(policy: RetryPolicy) -> ClientWithMiddleware {
    let client = reqwest::Client::new();
    ClientBuilder::new(client.clone())
        .with(RetrySafetyMiddleware::new(policy))
        .with(ReadWholeMiddleware::new().resume_with(client))
        .build()
}

fn req(method: Method, url: &str, keys: &[&str]) -> Request<Full<Bytes>> {
    let mut b = Request::builder().method(method).uri(url);
    for key in keys {
        b = b.header("idempotency-key", *key);
    }
    b.body(Full::new(Bytes::from_static(b"{\"to\":\"a@example.com\"}")))
        .unwrap()
}

async fn read_all<B>(mut body: B) -> (Vec<u8>, Option<BoxError>)
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Some(data) = frame.data_ref() {
                    bytes.extend_from_slice(data);
                }
            }
            Err(err) => return (bytes, Some(err.into())),
        }
    }
    (bytes, None)
}

async fn reqwest_read_all(mut res: reqwest::Response) -> (Vec<u8>, Option<reqwest::Error>) {
    let mut bytes = Vec::new();
    loop {
        match res.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) => return (bytes, None),
            Err(err) => return (bytes, Some(err)),
        }
    }
}

fn find_cut<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a BodyCutError> {
    let mut source: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(cut) = e.downcast_ref::<BodyCutError>() {
            return Some(cut);
        }
        source = e.source();
    }
    None
}

/// Everything an error says: Display and Debug of it and of each source.
fn all_said(err: &(dyn StdError + 'static)) -> String {
    let mut out = String::new();
    let mut source: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = source {
        out.push_str(&format!("{e}\n{e:?}\n"));
        source = e.source();
    }
    out
}

/// The caller's bytes are a prefix of `whole` ending in an error, or all of `whole` without
/// one: nothing spliced, nothing silently truncated.
fn assert_no_splice(what: &str, bytes: &[u8], err: &Option<BoxError>, whole: &[u8]) {
    assert!(bytes.len() <= whole.len(), "{what}: {} bytes", bytes.len());
    assert!(
        bytes == &whole[..bytes.len()],
        "{what}: spliced after {} bytes",
        bytes
            .iter()
            .zip(whole)
            .position(|(a, b)| a != b)
            .unwrap_or(0)
    );
    if err.is_none() {
        assert_eq!(bytes.len(), whole.len(), "{what}: silently truncated");
    }
}

/// A `200` of `len` bytes of `rep(len, v)` with these extra header lines, cut after `at`.
fn cut_at(status: &str, len: usize, v: u8, at: usize, extra: &[&str]) -> Vec<Act> {
    let mut lines = vec![cl(len)];
    lines.extend(extra.iter().map(|l| l.to_string()));
    vec![
        Act::W(head(status, &lines)),
        Act::W(rep(len, v)[..at].to_vec()),
        Act::Close,
    ]
}

/// A whole answer.
fn whole(status: &str, len: usize, v: u8, extra: &[&str]) -> Vec<Act> {
    let mut lines = vec![cl(len)];
    lines.extend(extra.iter().map(|l| l.to_string()));
    vec![Act::W(head(status, &lines)), Act::W(rep(len, v))]
}

/// `len` bytes in 512-byte frames `gap_ms` apart.
fn slow(status: &str, len: usize, v: u8, gap_ms: u64, extra: &[&str]) -> Vec<Act> {
    let mut lines = vec![cl(len)];
    lines.extend(extra.iter().map(|l| l.to_string()));
    let data = rep(len, v);
    let mut acts = vec![Act::W(head(status, &lines))];
    for (i, piece) in data.chunks(512).enumerate() {
        if i > 0 {
            acts.push(Act::Pause(gap_ms));
        }
        acts.push(Act::W(piece.to_vec()));
    }
    acts
}

/// A head and `at` bytes of `len`, then nothing for good (the connection stays open).
fn stall_at(len: usize, v: u8, at: usize, extra: &[&str]) -> Vec<Act> {
    let mut lines = vec![cl(len)];
    lines.extend(extra.iter().map(|l| l.to_string()));
    vec![
        Act::W(head("200 OK", &lines)),
        Act::W(rep(len, v)[..at].to_vec()),
        Act::Pause(FOREVER_MS),
    ]
}

const REPLAYED: &str = "idempotent-replayed: true";

// =============================================================================================
// OPEN DEFECTS: each fails today.
// =============================================================================================

/// **Splice.** A keyed write whose first answer was the server's replay of a retryable status
/// (a `503` the server stored for the key, marked `idempotent-replayed: true`) and whose body,
/// past the limit, is cut; the write is sent again with its key and the answer is a `503` of
/// the same length that is NOT marked as a replay (e.g. a proxy's or the application's own
/// error page of the same length, served without running the key's record): another response,
/// whose bytes are spliced onto the first. Inside the trust model (the key is trusted, the
/// server honours keys): the crate itself decides "replay" from stale state.
///
/// What happened: 2 requests (the resend is allowed: the key is trusted). The resend's `503`
/// is classified retryable, so `Resume::decide` returns `Phase::Waiting` without
/// `set_stop`; `Attempts::last_stop` still holds `StopReason::StoredResponse` from the *first*
/// response (`continuation(reason)`), so `Resume::poll_resume` computes `replayed = true`,
/// `check_replay` passes (same status, length, no ETag, no coding) and the caller reads
/// `rep(v1)[..100000] ++ rep(v2)[100000..]` as a whole body, no error.
///
/// Fixed (the fix proposed): compute `replayed` from this response's own classification (the policy's replay mark
/// on `res.headers()`, e.g. a `Classification::is_stored_response` returned by the decision), or reset
/// `last_stop` before each decision so that a `Step::Wait` cannot leave a stale `Replayed`.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn a_replayed_503_cut_then_an_unmarked_503_is_never_spliced() {
    let server = Raw::start(|n, _| {
        if n == 1 {
            cut_at("503 Service Unavailable", BIG, 1, HALF, &[REPLAYED])
        } else {
            whole("503 Service Unavailable", BIG, 2, &[])
        }
    })
    .await;
    let policy = policy().honor_idempotency_key(true).build().unwrap();
    let res = stack(policy)
        .oneshot(req(Method::POST, &server.url("/v1/send"), &["k-503"]))
        .await
        .expect("the server answered");
    assert_eq!(res.status(), 503);
    let (bytes, err) = tokio::time::timeout(HANG, read_all(res.into_body()))
        .await
        .expect("no hang");
    // The unmarked 503 is not the replay: never spliced, and (retryable, the key trusted) the
    // write is sent again until retries are used up: 1 + 3.
    assert_eq!(server.requests(), 4);
    assert_no_splice("replayed 503", &bytes, &err, &rep(BIG, 1));
}

/// The same through the reqwest adapter.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn reqwest_a_replayed_503_cut_then_an_unmarked_503_is_never_spliced() {
    let server = Raw::start(|n, _| {
        if n == 1 {
            cut_at("503 Service Unavailable", BIG, 1, HALF, &[REPLAYED])
        } else {
            whole("503 Service Unavailable", BIG, 2, &[])
        }
    })
    .await;
    let policy = policy().honor_idempotency_key(true).build().unwrap();
    let res = reqwest_client(policy)
        .post(server.url("/v1/send"))
        .header("Idempotency-Key", "k-503")
        .body("{}")
        .send()
        .await
        .expect("the server answered");
    let (bytes, err) = tokio::time::timeout(HANG, reqwest_read_all(res))
        .await
        .expect("no hang");
    assert_eq!(server.requests(), 4);
    let err = err.map(|e| Box::new(e) as BoxError);
    assert_no_splice("reqwest replayed 503", &bytes, &err, &rep(BIG, 1));
}

/// **Weaker (a write's response lost).** A write whose key the policy does not trust (or a
/// keyed write marked `NoRetry`, or one with `max_retries(0)`) is never sent again, but
/// `ReadWhole` reads its small body inside the attempt anyway (`may_repeat` looks only at the
/// header: `has_key`), under the attempt's clock. The README promises, for "a write without a
/// trusted key", "never read inside the attempt (a slow body keeps its response)".
///
/// What happens: the server applies the write and answers `200` with 8 KiB in 512-byte frames
/// 60 ms apart (about 1 s); per-attempt timeout 300 ms, deadline 700 ms. The per-attempt timer
/// is (rightly) extended, but the deadline cuts the attempt while the body is read: the caller
/// gets `Err(Error)` (timed out, "may have been applied") instead of the `200` and a body
/// ending in a `BodyCutError` with the status. 1 request, 1 write (never twice holds). An
/// unkeyed write streams and keeps its response (see the regression test below).
///
/// Fixed (the fix proposed): let the retry layer tell `ReadWhole` whether it may repeat the attempt (e.g. a flag in
/// `AttemptClock`, or a marker the layer inserts when `Plan::may_retry` and the verdict's
/// `repeat_is_harmless`), and stream the others untouched; or, when the deadline fires while
/// `ReadWhole` reads, return the response whose body ends in a `BodyCutError`.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn a_write_that_is_never_repeated_keeps_its_response_under_the_deadline() {
    let base = || {
        policy()
            .attempt_timeout(Duration::from_millis(300))
            .deadline(Duration::from_millis(700))
    };
    let cases: Vec<(&str, RetryPolicy, bool)> = vec![
        ("key not trusted", base().build().unwrap(), false),
        (
            "trusted key, NoRetry",
            base().honor_idempotency_key(true).build().unwrap(),
            true,
        ),
        (
            "trusted key, max_retries(0)",
            base()
                .honor_idempotency_key(true)
                .max_retries(0)
                .build()
                .unwrap(),
            false,
        ),
    ];
    let mut lost = Vec::new();
    for (what, policy, no_retry) in cases {
        let server = Raw::start(|_, _| slow("200 OK", SMALL, 1, 60, &[])).await;
        let mut r = req(Method::POST, &server.url("/v1/send"), &["k-slow"]);
        if no_retry {
            r.extensions_mut().insert(NoRetry);
        }
        let out = tokio::time::timeout(HANG, stack(policy).oneshot(r))
            .await
            .expect("no hang");
        assert_eq!(server.writes(), 1, "{what}: never twice");
        match out {
            Ok(res) => {
                let (bytes, err) = tokio::time::timeout(HANG, read_all(res.into_body()))
                    .await
                    .expect("no hang");
                match err {
                    None => assert_eq!(bytes, rep(SMALL, 1), "{what}"),
                    Some(err) => assert!(find_cut(&*err).is_some(), "{what}: {err}"),
                }
            }
            Err(e) => lost.push(format!("{what}: {e}")),
        }
    }
    assert!(lost.is_empty(), "responses lost: {lost:#?}");
}

/// **Hang.** A body past the limit that cannot resume (a `GET` without a validator, an unkeyed
/// `POST`) and stalls for good after half of it: the per-attempt timeout does not bound the
/// wait for its next frame, though `attempt_clock.rs` says the per-attempt timeout bounds
/// "each wait for a frame of the body, as it does for a body that streams to the caller" and
/// the README counts "a wait for a frame longer than the per-attempt timeout" as a cut.
///
/// What happens: 1 request; the caller gets the head and 100000 bytes, then its read waits
/// forever (here until the test's 8 s guard): `WholeBody::poll_frame` runs the idle clock only
/// through a `Resume` (`resume.poll_idle`), and a body that `not_resuming` has none. The same
/// with a per-attempt timeout and a deadline (the deadline does not end it either).
///
/// Fixed (the fix proposed): give a streamed body that cannot resume the idle clock too (fill the `ResumeSlot`, or a
/// lighter slot with the attempt's limit, for every streamed body, and cut it with a
/// `BodyCutError` whose `why_no_resume` says why no resume was made).
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn a_stall_past_the_limit_that_cannot_resume_is_cut_by_the_per_attempt_timeout() {
    let t = Duration::from_millis(200);
    let mut hung = Vec::new();
    for (what, method, deadline) in [
        ("GET without a validator", Method::GET, None),
        ("unkeyed POST", Method::POST, None),
        (
            "GET without a validator, deadline 1 s",
            Method::GET,
            Some(Duration::from_secs(1)),
        ),
    ] {
        let server = Raw::start(|_, _| stall_at(BIG, 1, HALF, &[])).await;
        let mut policy = policy().attempt_timeout(t);
        if let Some(deadline) = deadline {
            policy = policy.deadline(deadline);
        }
        let res = stack(policy.build().unwrap())
            .oneshot(req(method, &server.url("/f"), &[]))
            .await
            .expect("the head arrives");
        // 40 per-attempt timeouts (and 8 deadlines): a hang.
        let guard = Duration::from_secs(8);
        let read = tokio::time::timeout(guard, read_all(res.into_body())).await;
        assert_eq!(server.requests(), 1, "{what}");
        let Ok((bytes, err)) = read else {
            hung.push(what);
            continue;
        };
        assert_eq!(bytes.len(), HALF, "{what}");
        let err = err.expect("a stall is a cut");
        assert!(find_cut(&*err).is_some(), "{what}: {err}");
    }
    assert!(hung.is_empty(), "the body's read hangs: {hung:?}");
}

/// **Weaker (a trusted keyed write never recovered).** A policy whose key header is not the
/// default name (`idempotency_key_header("x-idempotency-key")`) trusts the key, but
/// `ReadWhole` and `ReadWholeMiddleware` look for the literal `idempotency-key` header: the
/// keyed write past the limit is `NotRepeatable` (and within the limit it is streamed, never
/// read inside the attempt).
///
/// What happens: the first answer (`201`, 200000 bytes) is cut after 100000; a server that
/// honours keys would replay it (script: the second answer is the marked replay); 1 request,
/// the body ends in `BodyCutError` with `why_no_resume() == Some(NotRepeatable)`.
///
/// Fixed (the fix proposed): let the retry layer say whether the attempt is keyed (its `Plan` knows the policy's key
/// header and the trust): e.g. a field of `AttemptClock` / a marker in the attempt's extensions
/// that `ReadWhole` reads instead of `has_key`.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn a_keyed_write_with_the_policys_own_key_header_is_recovered_past_the_limit() {
    let server = Raw::start(|n, _| {
        if n == 1 {
            cut_at("201 Created", BIG, 1, HALF, &[])
        } else {
            whole("201 Created", BIG, 1, &[REPLAYED])
        }
    })
    .await;
    let policy = policy()
        .honor_idempotency_key(true)
        .idempotency_key_header(HeaderName::from_static("x-idempotency-key"))
        .build()
        .unwrap();
    let r = Request::post(server.url("/v1/send"))
        .header("x-idempotency-key", "k-custom")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let res = stack(policy).oneshot(r).await.expect("answered");
    let (bytes, err) = tokio::time::timeout(HANG, read_all(res.into_body()))
        .await
        .expect("no hang");
    assert!(err.is_none(), "{:?}", err.map(|e| all_said(&*e)));
    assert_eq!(bytes, rep(BIG, 1));
    assert_eq!(server.requests(), 2);
}

// =============================================================================================
// Never twice: attacks that held.
// =============================================================================================

/// Keys that do not make a write safe to repeat, whatever `ReadWhole` sees in the header: an
/// empty key, an empty sf-string, a malformed key, a trusted key with `NoRetry` or
/// `max_retries(0)`, an untrusted key whose first answer spoofs the replay mark. Within and past
/// the limit, through both front ends: 1 request, 1 write, the body ends in a `BodyCutError`.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn writes_whose_key_makes_nothing_safe_are_sent_once() {
    let trusted = || policy().honor_idempotency_key(true);
    let cases: Vec<(&str, Vec<&str>, RetryPolicy, bool)> = vec![
        ("empty key", vec![""], trusted().build().unwrap(), false),
        (
            "empty sf-string",
            vec!["\"\""],
            trusted().build().unwrap(),
            false,
        ),
        (
            "malformed key",
            vec!["a b"],
            trusted().build().unwrap(),
            false,
        ),
        ("NoRetry", vec!["k-1"], trusted().build().unwrap(), true),
        (
            "max_retries(0)",
            vec!["k-1"],
            trusted().max_retries(0).build().unwrap(),
            false,
        ),
        (
            "untrusted key, spoofed replay mark",
            vec!["k-1"],
            policy().build().unwrap(),
            false,
        ),
        (
            "trusted for another host only",
            vec!["k-1"],
            policy()
                .honor_idempotency_key_for_host("api.example.com")
                .build()
                .unwrap(),
            false,
        ),
    ];
    for (what, keys, policy, no_retry) in cases {
        for (len, at) in [(1000, 500), (BIG, HALF)] {
            let extra = extra_of(what);
            let server = Raw::start(move |_, _| {
                let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                cut_at("201 Created", len, 1, at, &extra)
            })
            .await;
            let mut r = req(Method::POST, &server.url("/v1/send"), &keys);
            if no_retry {
                r.extensions_mut().insert(NoRetry);
            }
            let res = stack(policy.clone()).oneshot(r).await.expect("answered");
            let (bytes, err) = tokio::time::timeout(HANG, read_all(res.into_body()))
                .await
                .expect("no hang");
            assert_eq!(server.writes(), 1, "tower {what} {len}");
            assert_eq!(server.requests(), 1, "tower {what} {len}");
            assert_eq!(bytes, rep(len, 1)[..at], "tower {what} {len}");
            let err = err.unwrap_or_else(|| panic!("tower {what} {len}: a cut"));
            let cut = find_cut(&*err).expect("a BodyCutError");
            assert_eq!(cut.bytes_received(), at as u64);
            assert_eq!(cut.status(), 201);

            // reqwest
            let server2 = Raw::start({
                let extra: Vec<String> = extra_of(what);
                move |_, _| {
                    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                    cut_at("201 Created", len, 1, at, &extra)
                }
            })
            .await;
            let mut b = reqwest_client(policy.clone())
                .post(server2.url("/v1/send"))
                .body("{}");
            for key in &keys {
                b = b.header("Idempotency-Key", *key);
            }
            if no_retry {
                b = b.with_extension(NoRetry);
            }
            let res = b.send().await.expect("answered");
            let (bytes, err) = tokio::time::timeout(HANG, reqwest_read_all(res))
                .await
                .expect("no hang");
            assert_eq!(server2.writes(), 1, "reqwest {what} {len}");
            assert_eq!(bytes, rep(len, 1)[..at], "reqwest {what} {len}");
            assert!(err.is_some(), "reqwest {what} {len}");
        }
    }
}

fn extra_of(what: &str) -> Vec<String> {
    if what.contains("spoofed") || what.contains("another host") {
        vec![REPLAYED.to_string()]
    } else {
        vec![]
    }
}

/// A trusted key on `PATCH` (and `POST`) past the limit, against a server that does not honour
/// keys (it applies the write again, marks nothing): sent again once (the user said the server
/// honours keys), never with `Range`, and never spliced (`NotTheSame`).
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn a_trusted_keyed_write_to_a_server_that_does_not_replay_is_never_spliced() {
    for method in [Method::POST, Method::PATCH] {
        let server = Raw::start(|n, _| {
            if n == 1 {
                cut_at("200 OK", BIG, 1, HALF, &[])
            } else {
                whole("200 OK", BIG, 2, &[])
            }
        })
        .await;
        let policy = policy().honor_idempotency_key(true).build().unwrap();
        let res = stack(policy)
            .oneshot(req(method.clone(), &server.url("/v1/send"), &["k-2"]))
            .await
            .expect("answered");
        let (bytes, err) = tokio::time::timeout(HANG, read_all(res.into_body()))
            .await
            .expect("no hang");
        assert_no_splice(method.as_str(), &bytes, &err, &rep(BIG, 1));
        let err = err.expect("not the replay: the body ends in the error");
        let cut = find_cut(&*err).expect("a BodyCutError");
        assert_eq!(cut.why_no_resume(), Some(NoResume::NotTheSame));
        assert_eq!(server.writes(), 2, "{method}");
        assert_eq!(server.ranges(), 0, "{method}");
    }
}

// =============================================================================================
// Never spliced: replays that differ.
// =============================================================================================

/// The first answer to a trusted keyed `POST` (`201`, 200000 bytes, ETag `"v1"`) is cut after
/// 100000 bytes; the resend's answer differs from the replay of the same response in one way
/// each time. Nothing is spliced: the body ends in `NotTheSame`, 2 requests.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn a_replay_that_differs_is_never_spliced() {
    let first = ["etag: \"v1\""];
    let cases: Vec<(&str, Vec<Act>)> = vec![
        (
            "not marked",
            whole("201 Created", BIG, 1, &["etag: \"v1\""]),
        ),
        (
            "another status",
            whole("200 OK", BIG, 1, &["etag: \"v1\"", REPLAYED]),
        ),
        (
            "another ETag",
            whole("201 Created", BIG, 1, &["etag: \"v2\"", REPLAYED]),
        ),
        ("no ETag", whole("201 Created", BIG, 1, &[REPLAYED])),
        (
            "a coding",
            whole(
                "201 Created",
                BIG,
                1,
                &["etag: \"v1\"", "content-encoding: gzip", REPLAYED],
            ),
        ),
        (
            "shorter",
            whole("201 Created", BIG - 1, 1, &["etag: \"v1\"", REPLAYED]),
        ),
        (
            "longer (a superset)",
            whole("201 Created", BIG + 10, 1, &["etag: \"v1\"", REPLAYED]),
        ),
        (
            "the body omitted",
            whole(
                "201 Created",
                0,
                1,
                &[
                    "etag: \"v1\"",
                    "idempotent-replay-body: omitted",
                    "x-should-retry: false",
                    REPLAYED,
                ],
            ),
        ),
        (
            "replay mark not `true`",
            whole(
                "201 Created",
                BIG,
                1,
                &["etag: \"v1\"", "idempotent-replayed: yes"],
            ),
        ),
    ];
    for (what, second) in cases {
        let second = Arc::new(second);
        let server = Raw::start(move |n, _| {
            if n == 1 {
                cut_at("201 Created", BIG, 1, HALF, &first)
            } else {
                (*second).clone()
            }
        })
        .await;
        let policy = policy().honor_idempotency_key(true).build().unwrap();
        let res = stack(policy)
            .oneshot(req(Method::POST, &server.url("/v1/send"), &["k-3"]))
            .await
            .expect("answered");
        let handle = BodyReport::of(&res).cloned().expect("a body report");
        let (bytes, err) = tokio::time::timeout(HANG, read_all(res.into_body()))
            .await
            .expect("no hang");
        assert_no_splice(what, &bytes, &err, &rep(BIG, 1));
        let err = err.unwrap_or_else(|| panic!("{what}: the body ends in the error"));
        let cut = find_cut(&*err).expect("a BodyCutError");
        assert_eq!(cut.why_no_resume(), Some(NoResume::NotTheSame), "{what}");
        assert_eq!(cut.bytes_received(), HALF as u64, "{what}");
        assert_eq!(server.requests(), 2, "{what}");
        let report = handle.get().expect("the cut was decided on");
        assert_eq!(report.attempts(), 2, "{what}");
        assert_eq!(
            cut.report().map(RetryReport::attempts),
            Some(2),
            "{what}: the error carries the report"
        );
    }
}

/// The resend is first answered `409` (the key's first request still in flight), then with
/// the replay; and a replay whose own body is cut is followed by another: the body continues
/// each time from where it was, whole and unspliced, 3 requests.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn a_409_then_the_replay_and_a_cut_replay_then_the_replay_continue_the_body() {
    for (what, second) in [
        (
            "409 then replay",
            vec![
                Act::W(head("409 Conflict", &[cl(7), "retry-after: 0".to_string()])),
                Act::W(b"in use!".to_vec()),
            ],
        ),
        (
            "a replay cut before the bytes delivered, then replay",
            cut_at(
                "201 Created",
                BIG,
                1,
                HALF - 50_000,
                &["etag: \"v1\"", REPLAYED],
            ),
        ),
        (
            "a cut replay then replay",
            cut_at(
                "201 Created",
                BIG,
                1,
                HALF + 50_000,
                &["etag: \"v1\"", REPLAYED],
            ),
        ),
    ] {
        let second = Arc::new(second);
        let server = Raw::start(move |n, _| match n {
            1 => cut_at("201 Created", BIG, 1, HALF, &["etag: \"v1\""]),
            2 => (*second).clone(),
            _ => whole("201 Created", BIG, 1, &["etag: \"v1\"", REPLAYED]),
        })
        .await;
        let policy = policy().honor_idempotency_key(true).build().unwrap();
        let res = stack(policy)
            .oneshot(req(Method::POST, &server.url("/v1/send"), &["k-4"]))
            .await
            .expect("answered");
        let handle = BodyReport::of(&res).cloned().expect("a body report");
        let mut body = res.into_body();
        let (bytes, err) = tokio::time::timeout(HANG, read_all(&mut body))
            .await
            .expect("no hang");
        assert!(err.is_none(), "{what}: {:?}", err.map(|e| all_said(&*e)));
        assert_eq!(bytes, rep(BIG, 1), "{what}");
        assert_eq!(server.requests(), 3, "{what}");
        assert_eq!(server.ranges(), 0, "{what}");
        assert_eq!(body.resumes(), 2, "{what}");
        assert_eq!(handle.get().expect("decided").attempts(), 3, "{what}");
    }
}

/// Against the crate's own server: a keyed write within the limit whose body stalls (the
/// handler ran, its response was stored) is cut by the per-frame wait and sent again with its
/// key; the replay is read whole. 2 requests, 1 write applied.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn a_keyed_write_within_the_limit_that_stalls_is_replayed_once() {
    let body = crate::support::read_whole::representation(SMALL);
    let server =
        CutServer::start_with_keys(Options::new(body.clone()), vec![Cut::StallAt(SMALL / 2)]).await;
    let policy = policy()
        .honor_idempotency_key(true)
        .attempt_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let out = tokio::time::timeout(
        HANG,
        stack(policy).oneshot(req(Method::POST, &server.url("/v1/messages"), &["k-5"])),
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

// =============================================================================================
// The clock, over real sockets.
// =============================================================================================

/// A small body that stalls for good after half, with a per-attempt timeout and no deadline:
/// the wait for its next frame is a cut, and the body is read again. Through the tower stack,
/// with a `Buffer` between the retry layer and `ReadWhole`, with a task of its own for the
/// attempt (the clock set from another task), with a second retry layer inside, and through
/// the reqwest adapter. 2 requests each, the body whole.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn a_stall_within_the_limit_without_a_deadline_is_cut_and_read_again_in_every_stack() {
    let t = Duration::from_millis(250);
    let mk = || policy().attempt_timeout(t).build().unwrap();
    for stack_name in ["plain", "buffer", "spawned", "nested", "reqwest"] {
        let server = Raw::start(|n, _| {
            if n == 1 {
                stall_at(SMALL, 1, SMALL / 2, &[])
            } else {
                whole("200 OK", SMALL, 1, &[])
            }
        })
        .await;
        let url = server.url("/f");
        let read = async {
            if stack_name == "reqwest" {
                let res = reqwest_client(mk())
                    .get(&url)
                    .send()
                    .await
                    .expect("answered");
                let (bytes, err) = reqwest_read_all(res).await;
                (bytes, err.map(|e| Box::new(e) as BoxError))
            } else {
                let res = any_stack(stack_name, mk())
                    .oneshot(req(Method::GET, &url, &[]))
                    .await
                    .expect("answered");
                read_all(res.into_body()).await
            }
        };
        let (bytes, err) = tokio::time::timeout(HANG, read)
            .await
            .unwrap_or_else(|_| panic!("{stack_name}: hangs"));
        assert!(err.is_none(), "{stack_name}: {err:?}");
        assert_eq!(bytes, rep(SMALL, 1), "{stack_name}");
        assert_eq!(server.requests(), 2, "{stack_name}");
    }
}

/// A small body that is slow but keeps coming (16 frames 60 ms apart, about 1 s) under a
/// per-attempt timeout of 250 ms: read whole in one request in every stack (the clock is set
/// from another task behind a `Buffer` or a spawned attempt, or from inside a second layer).
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn a_slow_healthy_small_body_is_read_whole_in_every_stack() {
    let t = Duration::from_millis(250);
    let mk = || policy().attempt_timeout(t).build().unwrap();
    for stack_name in ["plain", "buffer", "spawned", "nested", "reqwest"] {
        let server = Raw::start(|_, _| slow("200 OK", SMALL, 1, 60, &[])).await;
        let url = server.url("/f");
        let read = async {
            if stack_name == "reqwest" {
                let res = reqwest_client(mk())
                    .get(&url)
                    .send()
                    .await
                    .expect("answered");
                let (bytes, err) = reqwest_read_all(res).await;
                (bytes, err.map(|e| Box::new(e) as BoxError))
            } else {
                let res = any_stack(stack_name, mk())
                    .oneshot(req(Method::GET, &url, &[]))
                    .await
                    .unwrap_or_else(|e| panic!("{stack_name}: {e}"));
                read_all(res.into_body()).await
            }
        };
        let (bytes, err) = tokio::time::timeout(HANG, read)
            .await
            .unwrap_or_else(|_| panic!("{stack_name}: hangs"));
        assert!(err.is_none(), "{stack_name}: {err:?}");
        assert_eq!(bytes, rep(SMALL, 1), "{stack_name}");
        assert_eq!(server.requests(), 1, "{stack_name}");
    }
}

/// The deadline stays absolute while a slow body is read inside the attempt, in every stack:
/// the request ends in an error that names the deadline, 1 request.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn the_deadline_cuts_a_slow_body_read_inside_the_attempt_in_every_stack() {
    for (stack_name, with_attempt) in [
        ("plain", true),
        ("plain", false),
        ("buffer", true),
        ("spawned", true),
        ("nested", true),
        ("nested", false),
        ("reqwest", true),
        ("reqwest", false),
    ] {
        let mut p = policy().deadline(Duration::from_millis(500));
        if with_attempt {
            p = p.attempt_timeout(Duration::from_millis(200));
        }
        let p = p.build().unwrap();
        let server = Raw::start(|_, _| slow("200 OK", SMALL, 1, 60, &[])).await;
        let url = server.url("/f");
        let out = async {
            if stack_name == "reqwest" {
                match reqwest_client(p).get(&url).send().await {
                    Ok(res) => Ok(reqwest_read_all(res).await.1.map(|e| e.to_string())),
                    Err(e) => Err(all_said(&e)),
                }
            } else {
                match any_stack(stack_name, p)
                    .oneshot(req(Method::GET, &url, &[]))
                    .await
                {
                    Ok(res) => Ok(read_all(res.into_body()).await.1.map(|e| all_said(&*e))),
                    Err(e) => Err(all_said(&e)),
                }
            }
        };
        let out = tokio::time::timeout(HANG, out)
            .await
            .unwrap_or_else(|_| panic!("{stack_name} {with_attempt}: hangs"));
        let said = match out {
            Err(said) => said,
            Ok(Some(said)) => said,
            Ok(None) => panic!("{stack_name} {with_attempt}: read whole past the deadline"),
        };
        assert!(
            said.to_lowercase().contains("deadline"),
            "{stack_name} {with_attempt}: {said}"
        );
        assert_eq!(server.requests(), 1, "{stack_name} {with_attempt}");
    }
}

/// The stacks the clock tests run through: the retry layer, then (`buffer`) a `Buffer`,
/// (`spawned`) a service that runs each attempt in a task of its own, or (`nested`) a second
/// retry layer, then `ReadWhole` over hyper-util's client.
fn any_stack(
    name: &str,
    policy: RetryPolicy,
) -> tower::util::BoxCloneService<
    Request<Full<Bytes>>,
    Response<WholeBody<Incoming>>,
    tower_retry_safety::Error,
> {
    let read = ReadWholeLayer::new();
    match name {
        "plain" => tower::util::BoxCloneService::new(
            ServiceBuilder::new()
                .layer(policy)
                .layer(read)
                .service(client()),
        ),
        "buffer" => tower::util::BoxCloneService::new(
            ServiceBuilder::new()
                .layer(policy)
                .layer(BufferLayer::new(8))
                .layer(read)
                .service(client()),
        ),
        "spawned" => tower::util::BoxCloneService::new(
            ServiceBuilder::new()
                .layer(policy)
                .layer(tower::layer::layer_fn(Spawned))
                .layer(read)
                .service(client()),
        ),
        "nested" => tower::util::BoxCloneService::new(
            ServiceBuilder::new()
                .layer(policy)
                .layer(self::policy().build().unwrap())
                .layer(read)
                .service(client()),
        ),
        other => panic!("no stack {other}"),
    }
}

/// Runs each call of the inner service in a task of its own.
#[derive(Clone)]
struct Spawned<S>(S);

impl<S, R> Service<R> for Spawned<S>
where
    S: Service<R> + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError> + Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.0.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: R) -> Self::Future {
        let fut = self.0.call(req);
        Box::pin(async move {
            tokio::spawn(fut)
                .await
                .map_err(|e| Box::new(e) as BoxError)?
                .map_err(Into::into)
        })
    }
}

// =============================================================================================
// The clock on paused time, against an in-memory service.
// =============================================================================================

/// A body of an exact length fed by a channel: it stalls while the sender is alive and sends
/// nothing.
struct Chan {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    left: u64,
}

impl Body for Chan {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match ready!(self.rx.poll_recv(cx)) {
            Some(data) => {
                self.left = self.left.saturating_sub(data.len() as u64);
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            None => Poll::Ready(None),
        }
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}

/// How one call of the in-memory service answers: the head after `head_after`, then each of
/// `frames` after its pause; `stall`: then nothing for good.
#[derive(Clone)]
struct Answer {
    head_after: Duration,
    len: u64,
    frames: Vec<(Duration, Bytes)>,
    stall: bool,
}

type Calls = Arc<AtomicU32>;

/// An in-memory inner service: call n gets `answers[n]` (the last one again after).
fn memory(
    answers: Vec<Answer>,
) -> (
    impl Service<
            Request<Full<Bytes>>,
            Response = Response<Chan>,
            Error = BoxError,
            Future = impl Send + 'static,
        > + Clone
        + Send
        + 'static,
    Calls,
) {
    let calls: Calls = Arc::default();
    let answers = Arc::new(answers);
    let c = calls.clone();
    let svc = tower::service_fn(move |_req: Request<Full<Bytes>>| {
        let n = c.fetch_add(1, Ordering::SeqCst) as usize;
        let answer = answers[n.min(answers.len() - 1)].clone();
        async move {
            tokio::time::sleep(answer.head_after).await;
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            tokio::spawn(async move {
                for (pause, data) in answer.frames {
                    tokio::time::sleep(pause).await;
                    if tx.send(data).await.is_err() {
                        return;
                    }
                }
                if answer.stall {
                    std::future::pending::<()>().await;
                }
                drop(tx);
            });
            Ok::<_, BoxError>(Response::new(Chan {
                rx,
                left: answer.len,
            }))
        }
    });
    (svc, calls)
}

fn bytes_of(len: usize, v: u8) -> Bytes {
    Bytes::from(rep(len, v))
}

/// With no deadline, a body that stalls for good after 10 of its 100 bytes is cut by the
/// per-frame wait (the retry layer's own timer no longer cuts a body being read): read again,
/// 2 calls, whole; the first cut came one per-attempt timeout after the last frame.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test(start_paused = true)]
async fn paused_a_stall_forever_without_a_deadline_is_cut_by_the_per_frame_wait() {
    let t = Duration::from_secs(1);
    let body = bytes_of(100, 1);
    let (svc, calls) = memory(vec![
        Answer {
            head_after: Duration::ZERO,
            len: 100,
            frames: vec![(Duration::ZERO, body.slice(..10))],
            stall: true,
        },
        Answer {
            head_after: Duration::ZERO,
            len: 100,
            frames: vec![(Duration::ZERO, body.clone())],
            stall: false,
        },
    ]);
    let stack = ServiceBuilder::new()
        .layer(policy().attempt_timeout(t).build().unwrap())
        .layer(ReadWholeLayer::new())
        .service(svc);
    let started = tokio::time::Instant::now();
    let res = tokio::time::timeout(
        Duration::from_secs(3600),
        stack.oneshot(req(Method::GET, "http://h/f", &[])),
    )
    .await
    .expect("no hang")
    .expect("answered");
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(bytes, body);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let took = started.elapsed();
    assert!(took >= t && took < 2 * t, "{took:?}");
}

/// With no deadline, a body that trickles one byte every 0.9 × the per-attempt timeout is never
/// cut: 2000 bytes take 1800 per-attempt timeouts (30 min of paused time for `t` = 1 s), in one
/// call. Nothing but the length bounds it (at most limit × `t`: about 18 h for the default
/// 64 KiB and 1 s). With a deadline, the deadline ends it.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test(start_paused = true)]
async fn paused_a_trickle_just_under_the_timeout_is_bounded_only_by_its_length_or_the_deadline() {
    let t = Duration::from_secs(1);
    let gap = t * 9 / 10;
    let len = 2000;
    let body = bytes_of(len, 2);
    let trickle = Answer {
        head_after: Duration::ZERO,
        len: len as u64,
        frames: (0..len).map(|i| (gap, body.slice(i..i + 1))).collect(),
        stall: false,
    };
    let (svc, calls) = memory(vec![trickle.clone()]);
    let started = tokio::time::Instant::now();
    let res = ServiceBuilder::new()
        .layer(policy().attempt_timeout(t).build().unwrap())
        .layer(ReadWholeLayer::new())
        .service(svc)
        .oneshot(req(Method::GET, "http://h/f", &[]))
        .await
        .expect("answered");
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(bytes, body);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(started.elapsed() >= gap * len as u32);

    // A deadline of 100 s ends it: an error naming the deadline, one call.
    let (svc, calls) = memory(vec![trickle]);
    let out = ServiceBuilder::new()
        .layer(
            policy()
                .attempt_timeout(t)
                .deadline(Duration::from_secs(100))
                .build()
                .unwrap(),
        )
        .layer(ReadWholeLayer::new())
        .service(svc)
        .oneshot(req(Method::GET, "http://h/f", &[]))
        .await;
    let err = out.expect_err("the deadline passed while the body was read");
    assert!(all_said(&err).contains("deadline"), "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A head that arrives at the very instant the per-attempt timer fires is read (the attempt is
/// polled before its timer); one a millisecond later is cut and sent again. Whole either way.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test(start_paused = true)]
async fn paused_a_head_at_the_instant_the_timer_fires() {
    let t = Duration::from_secs(1);
    for (late, expected_calls) in [(Duration::ZERO, 1), (Duration::from_millis(1), 2)] {
        let body = bytes_of(100, 3);
        let (svc, calls) = memory(vec![
            Answer {
                head_after: t + late,
                len: 100,
                frames: vec![(Duration::ZERO, body.clone())],
                stall: false,
            },
            Answer {
                head_after: Duration::ZERO,
                len: 100,
                frames: vec![(Duration::ZERO, body.clone())],
                stall: false,
            },
        ]);
        let res = ServiceBuilder::new()
            .layer(policy().attempt_timeout(t).build().unwrap())
            .layer(ReadWholeLayer::new())
            .service(svc)
            .oneshot(req(Method::GET, "http://h/f", &[]))
            .await
            .expect("answered");
        let (bytes, err) = read_all(res.into_body()).await;
        assert!(err.is_none(), "{late:?}: {err:?}");
        assert_eq!(bytes, body, "{late:?}");
        assert_eq!(calls.load(Ordering::SeqCst), expected_calls, "{late:?}");
    }
}

/// A deadline-only policy puts no clock in the attempt: a body that stalls is ended by the
/// deadline (an error naming it), one call; a slow body within the deadline is read whole.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test(start_paused = true)]
async fn paused_a_deadline_only_policy_ends_a_stall_at_the_deadline() {
    let deadline = Duration::from_secs(10);
    let body = bytes_of(100, 4);
    let (svc, calls) = memory(vec![Answer {
        head_after: Duration::ZERO,
        len: 100,
        frames: vec![(Duration::ZERO, body.slice(..10))],
        stall: true,
    }]);
    let out = tokio::time::timeout(
        Duration::from_secs(3600),
        ServiceBuilder::new()
            .layer(policy().deadline(deadline).build().unwrap())
            .layer(ReadWholeLayer::new())
            .service(svc)
            .oneshot(req(Method::GET, "http://h/f", &[])),
    )
    .await
    .expect("no hang");
    let err = out.expect_err("the deadline ends the stall");
    assert!(all_said(&err).contains("deadline"), "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let (svc, calls) = memory(vec![Answer {
        head_after: Duration::ZERO,
        len: 100,
        frames: (0..10)
            .map(|i| (Duration::from_millis(900), body.slice(i * 10..i * 10 + 10)))
            .collect(),
        stall: false,
    }]);
    let res = ServiceBuilder::new()
        .layer(policy().deadline(deadline).build().unwrap())
        .layer(ReadWholeLayer::new())
        .service(svc)
        .oneshot(req(Method::GET, "http://h/f", &[]))
        .await
        .expect("within the deadline");
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(err.is_none());
    assert_eq!(bytes, body);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

// =============================================================================================
// Panics and secrets.
// =============================================================================================

/// A replay (or a first answer) whose `content-length` is odd: two values, leading zeros, a
/// sign, spaces. No panic, no hang, nothing spliced; at most 2 requests.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn odd_content_lengths_on_a_keyed_replay_neither_panic_nor_splice() {
    for length in [
        format!("content-length: {BIG}, {BIG}"),
        format!("content-length: 00{BIG}"),
        format!("content-length: +{BIG}"),
        format!("content-length:  {BIG} "),
        "content-length: 18446744073709551616".to_string(),
    ] {
        let second = Arc::new(length.clone());
        let server = Raw::start(move |n, _| {
            if n == 1 {
                cut_at("201 Created", BIG, 1, HALF, &[])
            } else {
                vec![
                    Act::W(head(
                        "201 Created",
                        &[(*second).clone(), REPLAYED.to_string()],
                    )),
                    Act::W(rep(BIG, 1)),
                ]
            }
        })
        .await;
        let policy = policy().honor_idempotency_key(true).build().unwrap();
        let res = stack(policy)
            .oneshot(req(Method::POST, &server.url("/v1/send"), &["k-6"]))
            .await
            .expect("answered");
        let (bytes, err) = tokio::time::timeout(HANG, read_all(res.into_body()))
            .await
            .unwrap_or_else(|_| panic!("{length}: hangs"));
        assert_no_splice(&length, &bytes, &err, &rep(BIG, 1));
        assert!(server.requests() <= 5, "{length}: {}", server.requests());
        assert_eq!(server.ranges(), 0);
    }
}

/// `BodyCutError` (Display and Debug, with its sources and its report) and `BodyReport`'s Debug
/// hold no header value (an `Authorization`, the `ETag`s, a cookie) and no byte of the body.
/// (The report's Debug shows the idempotency key, capped at 255 bytes, as it always has.)
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn cut_errors_and_body_reports_hold_no_secrets() {
    let secret_body: Vec<u8> = b"SECRET-BODY-".iter().copied().cycle().take(BIG).collect();
    let body = Arc::new(secret_body.clone());
    let server = Raw::start(move |n, _| {
        let tag = if n == 1 {
            "\"SECRET-ETAG-1\""
        } else {
            "\"SECRET-ETAG-2\""
        };
        let mut acts = vec![Act::W(head(
            "201 Created",
            &[
                cl(BIG),
                format!("etag: {tag}"),
                "set-cookie: SECRET-COOKIE=1".to_string(),
                REPLAYED.to_string(),
            ],
        ))];
        if n == 1 {
            acts.push(Act::W(body[..HALF].to_vec()));
            acts.push(Act::Close);
        } else {
            acts.push(Act::W((*body).clone()));
        }
        acts
    })
    .await;
    let policy = policy().honor_idempotency_key(true).build().unwrap();
    let r = Request::post(server.url("/v1/send?token=SECRET-QUERY"))
        .header("idempotency-key", "k-7")
        .header("authorization", "Bearer SECRET-TOKEN")
        .body(Full::new(Bytes::from_static(b"SECRET-REQUEST-BODY")))
        .unwrap();
    let res = stack(policy).oneshot(r).await.expect("answered");
    let handle = BodyReport::of(&res).cloned().expect("a body report");
    let (bytes, err) = read_all(res.into_body()).await;
    assert_eq!(bytes, secret_body[..HALF]);
    let err = err.expect("another ETag: not the same");
    let mut said = all_said(&*err);
    said.push_str(&format!("{handle:?}"));
    let cut = find_cut(&*err).expect("a BodyCutError");
    said.push_str(&format!("{cut}\n{cut:?}\n{:?}", cut.report()));
    assert!(said.contains("k-7"), "the key is in the report: {said}");
    for secret in ["SECRET", "Bearer", "token="] {
        assert!(!said.contains(secret), "{secret} in: {said}");
    }
    assert!(!format!("{cut}").contains("k-7"), "the key in the message");
}

/// **Hang.** A body of a known length within the limit that sends more than `MAX_FRAMES`
/// (1024) empty data frames, then stalls for good, under a per-attempt timeout and no deadline
/// (an HTTP/2 peer can send empty `DATA` frames).
///
/// What happens: each empty frame restarts `ReadWhole`'s per-frame wait, so the reading is not
/// cut; after 1024 of them `Reading::finish(true)` hands the rest on as a plain stream
/// (`WholeBody::then`), with no clock at all: the retry layer's timer was left to the reader
/// and is gone with the attempt, and the stream has no `Resume` (no idle timer). 1 call; the
/// caller's read never ends (here: until the test's hour of paused time).
///
/// Fixed (the fix proposed): when `ReadWhole` stops reading after `MAX_FRAMES`, keep timing the rest (hand it on
/// through `stream_on` with the attempt's clock, so it resumes or at least is cut by the
/// per-frame wait), or count empty frames against the per-frame wait instead of restarting it.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test(start_paused = true)]
async fn paused_many_empty_frames_then_a_stall_is_still_cut() {
    let (calls, out) = empty_frames_then_a_stall(1100).await;
    assert_eq!(calls, 1);
    let said = out.expect("the read of a stalled body ends");
    assert!(
        said.is_some(),
        "a body of 10 of its 100 bytes ended cleanly"
    );
}

/// The control: fewer empty frames than the cap, then a stall, is cut by the per-frame wait
/// (`max_retries(0)`: the body ends in the cut), 1 call.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test(start_paused = true)]
async fn paused_empty_frames_under_the_cap_then_a_stall_are_cut() {
    let (calls, out) = empty_frames_then_a_stall(1000).await;
    assert_eq!(calls, 1);
    let said = out.expect("the read of a stalled body ends");
    assert!(
        said.is_some(),
        "a body of 10 of its 100 bytes ended cleanly"
    );
}

/// `empty` empty frames, 10 bytes of 100, then nothing for good; per-attempt timeout 1 s, no
/// deadline, no retry. The calls made, and what the read said (`Err`: it hung for an hour).
async fn empty_frames_then_a_stall(
    empty: usize,
) -> (u32, Result<Option<String>, tokio::time::error::Elapsed>) {
    let t = Duration::from_secs(1);
    let mut frames: Vec<(Duration, Bytes)> =
        (0..empty).map(|_| (Duration::ZERO, Bytes::new())).collect();
    frames.push((Duration::ZERO, bytes_of(10, 5)));
    let (svc, calls) = memory(vec![Answer {
        head_after: Duration::ZERO,
        len: 100,
        frames,
        stall: true,
    }]);
    let read = async {
        let res = ServiceBuilder::new()
            .layer(policy().attempt_timeout(t).max_retries(0).build().unwrap())
            .layer(ReadWholeLayer::new())
            .service(svc)
            .oneshot(req(Method::GET, "http://h/f", &[]))
            .await;
        match res {
            Ok(res) => read_all(res.into_body()).await.1.map(|e| all_said(&*e)),
            Err(e) => Some(all_said(&e)),
        }
    };
    let out = tokio::time::timeout(Duration::from_secs(3600), read).await;
    (calls.load(Ordering::SeqCst), out)
}

/// The deadline fires while a body past the limit streams (a `GET` with a strong ETag, 20
/// frames 100 ms apart): the body ends in a `BodyCutError` that says the deadline ended it
/// (`is_deadline`), not resumed (`Refused`), its report stopped at the deadline; 1 request, no
/// range request. The same for a trusted keyed `POST` past the limit.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn the_deadline_ends_a_streamed_body_and_the_error_says_so() {
    for (method, keys) in [(Method::GET, &[][..]), (Method::POST, &["k-8"][..])] {
        let server = Raw::start(|_, _| {
            let data = rep(BIG, 1);
            let mut acts = vec![Act::W(head("200 OK", &[cl(BIG), "etag: \"v1\"".into()]))];
            for (i, piece) in data.chunks(10_000).enumerate() {
                if i > 0 {
                    acts.push(Act::Pause(100));
                }
                acts.push(Act::W(piece.to_vec()));
            }
            acts
        })
        .await;
        let policy = policy()
            .honor_idempotency_key(true)
            .attempt_timeout(Duration::from_millis(300))
            .deadline(Duration::from_millis(700))
            .build()
            .unwrap();
        let res = stack(policy)
            .oneshot(req(method.clone(), &server.url("/f"), keys))
            .await
            .expect("the head arrives before the deadline");
        let (bytes, err) = tokio::time::timeout(HANG, read_all(res.into_body()))
            .await
            .expect("no hang");
        assert_no_splice(method.as_str(), &bytes, &err, &rep(BIG, 1));
        let err = err.unwrap_or_else(|| panic!("{method}: read whole past the deadline"));
        let cut = find_cut(&*err).expect("a BodyCutError");
        assert!(cut.is_deadline(), "{method}: {cut}");
        assert!(cut.to_string().contains("deadline"), "{method}: {cut}");
        assert_eq!(cut.why_no_resume(), Some(NoResume::Refused), "{method}");
        assert_eq!(
            cut.report().map(RetryReport::stop_reason),
            Some(StopReason::Deadline),
            "{method}"
        );
        assert_eq!(server.requests(), 1, "{method}");
        assert_eq!(server.ranges(), 0, "{method}");
    }
}

/// The counterpart of the open `503` defect: a first answer that is the server's replay of a
/// `201` (marked), cut past the limit, then an unmarked `201` of the same length to the
/// resend: the resend's `Final` decision resets the stop reason, so it is not taken for the
/// replay. Nothing spliced, `NotTheSame`, 2 requests.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn a_replayed_201_cut_then_an_unmarked_201_is_never_spliced() {
    let server = Raw::start(|n, _| {
        if n == 1 {
            cut_at("201 Created", BIG, 1, HALF, &[REPLAYED])
        } else {
            whole("201 Created", BIG, 2, &[])
        }
    })
    .await;
    let policy = policy().honor_idempotency_key(true).build().unwrap();
    let res = stack(policy)
        .oneshot(req(Method::POST, &server.url("/v1/send"), &["k-201"]))
        .await
        .expect("answered");
    let (bytes, err) = tokio::time::timeout(HANG, read_all(res.into_body()))
        .await
        .expect("no hang");
    assert_no_splice("replayed 201", &bytes, &err, &rep(BIG, 1));
    let err = err.expect("not the replay");
    let cut = find_cut(&*err).expect("a BodyCutError");
    assert_eq!(cut.why_no_resume(), Some(NoResume::NotTheSame));
    assert_eq!(server.requests(), 2);
}

/// The reqwest adapter's `BodyCutError` (with its sources and its report) and `BodyReport`
/// hold no URL, header value or body byte either; nor does a cut read inside the attempt (the
/// report of the response whose small body was cut for good).
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn reqwest_cut_errors_and_body_reports_hold_no_secrets() {
    let server = Raw::start(|n, _| {
        let tag = if n == 1 {
            "etag: \"SECRET-ETAG-1\""
        } else {
            "etag: \"SECRET-ETAG-2\""
        };
        let data: Vec<u8> = b"SECRET-BODY-".iter().copied().cycle().take(BIG).collect();
        let mut acts = vec![Act::W(head(
            "201 Created",
            &[cl(BIG), tag.to_string(), REPLAYED.to_string()],
        ))];
        if n == 1 {
            acts.push(Act::W(data[..HALF].to_vec()));
            acts.push(Act::Close);
        } else {
            acts.push(Act::W(data));
        }
        acts
    })
    .await;
    let policy = policy().honor_idempotency_key(true).build().unwrap();
    let res = reqwest_client(policy)
        .post(server.url("/v1/send?token=SECRET-QUERY"))
        .header("idempotency-key", "k-9")
        .header("authorization", "Bearer SECRET-TOKEN")
        .body("SECRET-REQUEST-BODY")
        .send()
        .await
        .expect("answered");
    let handle = BodyReport::of_reqwest(&res)
        .cloned()
        .expect("a body report");
    let (bytes, err) = reqwest_read_all(res).await;
    assert_eq!(bytes.len(), HALF);
    let err = err.expect("another ETag: not the same");
    let cut = find_cut(&err).expect("a BodyCutError in the chain");
    assert_eq!(cut.why_no_resume(), Some(NoResume::NotTheSame));
    let mut said = all_said(cut);
    said.push_str(&format!("{handle:?}"));
    assert!(said.contains("k-9"), "the key is in the report: {said}");
    for secret in ["SECRET", "Bearer", "token="] {
        assert!(!said.contains(secret), "{secret} in: {said}");
    }
    assert_eq!(server.requests(), 2);
}
