//! Adversarial review of reading whole bodies (issue 23): `ReadWholeLayer` and
//! `ReadWholeMiddleware`, against real sockets on 127.0.0.1.
//!
//! Most tests use a scripted raw HTTP/1.1 server (`Raw`) that answers each request with exact
//! bytes (heads, lying lengths, cuts, garbage headers) and counts requests, range requests
//! and writes applied (every `POST`/`PATCH` it reads counts as a write applied). HTTP/2 tests
//! use hyper's server with a body that fails after some bytes (hyper then resets the stream).
//!
//! All twelve defects it found are fixed and their tests, which failed before, run; each says
//! what happened and the counts.

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::support::cut_server::{Cut, CutServer, Options};
use crate::support::raw_server::{cl, head, rep, Act, Raw, RawCounts, Seen};
use crate::support::read_whole::{find_cut, read_all};
use bytes::Bytes;
use http::{Method, Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use tokio::net::TcpListener;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_retry_safety::resume::{BodyReport, NoResume};
use tower_retry_safety::{
    Budget, NoRetry, ReadWholeLayer, ReadWholeMiddleware, RetryPolicy, RetryReport,
    RetrySafetyMiddleware, StopReason, WholeBody,
};

type Incoming = hyper::body::Incoming;

fn chunked(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

// ---------------------------------------------------------------------------------------------
// The tower stack and the reqwest stack.
// ---------------------------------------------------------------------------------------------

fn policy() -> tower_retry_safety::RetryPolicyBuilder {
    RetryPolicy::builder()
        .max_retries(5)
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .no_budget()
}

fn stack(
    policy: RetryPolicy,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<WholeBody<Incoming>>,
    Error = tower_retry_safety::Error,
> + Clone {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    ServiceBuilder::new()
        .layer(policy)
        .layer(ReadWholeLayer::new())
        .service(client)
}

fn h2_stack(
    policy: RetryPolicy,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<WholeBody<Incoming>>,
    Error = tower_retry_safety::Error,
> + Clone {
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    ServiceBuilder::new()
        .layer(policy)
        .layer(ReadWholeLayer::new())
        .service(client)
}

fn reqwest_client(policy: RetryPolicy) -> ClientWithMiddleware {
    let client = reqwest::Client::new();
    ClientBuilder::new(client.clone())
        .with(RetrySafetyMiddleware::new(policy))
        .with(ReadWholeMiddleware::new().resume_with(client))
        .build()
}

fn req(method: Method, url: &str, key: Option<&str>) -> Request<Full<Bytes>> {
    let mut b = Request::builder().method(method).uri(url);
    if let Some(key) = key {
        b = b.header("idempotency-key", key);
    }
    b.body(Full::new(Bytes::from_static(b"{\"to\":\"a@example.com\"}")))
        .unwrap()
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

/// The caller's bytes are a prefix of `whole` (nothing spliced), ending in an error, or all of
/// `whole` without one.
fn assert_no_splice(bytes: &[u8], err: &Option<BoxError>, whole: &[u8]) {
    assert!(
        bytes.len() <= whole.len(),
        "more bytes than the representation: {}",
        bytes.len()
    );
    assert!(
        bytes == &whole[..bytes.len()],
        "the caller's bytes are not a prefix of the representation (spliced) after {} bytes",
        bytes
            .iter()
            .zip(whole)
            .position(|(a, b)| a != b)
            .unwrap_or(0)
    );
    if err.is_none() {
        assert_eq!(
            bytes.len(),
            whole.len(),
            "a clean end with bytes missing (silent truncation)"
        );
    }
}

const BIG: usize = 200_000; // past the 64 KiB limit
const HALF: usize = 100_000;

// =============================================================================================
// DEFECTS (open): each fails today.
// =============================================================================================

/// A `206` whose body is shorter than its `Content-Range` says.
///
/// What happens: the first `GET` (200, `content-length: 200000`, strong ETag) is cut after
/// 100000 bytes; the range request gets `206`, `content-range: bytes 100000-199999/200000`,
/// `content-length: 50000`, and 50000 bytes, then the server keeps the connection open. hyper
/// ends that body cleanly at its own `content-length`; `WholeBody` returns `None` there, so
/// the caller gets 150000 of 200000 bytes and a clean end: a silently truncated body that
/// looks whole (2 requests, 1 range request, no error). The same with a chunked `206` that
/// ends early (second case).
///
/// Fix: in `Expect::check`, when the `206`'s body has an exact size hint, require it to equal
/// `last - first + 1`; and in `WholeBody`, keep the expected end (`total`, or `last + 1` of
/// the accepted range) and turn a clean end of `rest` before it into a cut (call
/// `resume.begin(...)` with a "body ended before its Content-Range" error) instead of
/// `Poll::Ready(None)`.
///
/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn a_206_shorter_than_its_content_range_is_not_a_clean_end() {
    for chunked_206 in [false, true] {
        let whole = rep(BIG, 1);
        let w = whole.clone();
        let server = Raw::start(move |_, seen| match seen.range {
            None => vec![
                Act::W(head("200 OK", &[cl(BIG), "etag: \"v1\"".into()])),
                Act::W(w[..HALF].to_vec()),
                Act::Close,
            ],
            Some(from) => {
                let from = from as usize;
                let short = &w[from..from + 50_000];
                let range = format!("content-range: bytes {from}-{}/{BIG}", BIG - 1);
                if chunked_206 {
                    let mut body = chunked(short);
                    body.extend_from_slice(b"0\r\n\r\n");
                    vec![
                        Act::W(head(
                            "206 Partial Content",
                            &[
                                range,
                                "etag: \"v1\"".into(),
                                "transfer-encoding: chunked".into(),
                            ],
                        )),
                        Act::W(body),
                    ]
                } else {
                    vec![
                        Act::W(head(
                            "206 Partial Content",
                            &[range, cl(50_000), "etag: \"v1\"".into()],
                        )),
                        Act::W(short.to_vec()),
                    ]
                }
            }
        })
        .await;
        let res = stack(policy().build().unwrap())
            .oneshot(req(Method::GET, &server.url("/f"), None))
            .await
            .unwrap();
        let (bytes, err) = read_all(res.into_body()).await;
        // The short 206's clean end is a cut: the rest is asked for again from 150000, and
        // this server's second 206 (50000 bytes from there) ends the body at its length.
        assert_eq!(server.ranges(), 2);
        assert_eq!((bytes.len(), err.is_none()), (BIG, true), "{err:?}");
        assert_no_splice(&bytes, &err, &whole);
    }
}

/// A `206` whose body is longer than its `Content-Range` says.
///
/// What happens: as above, but the `206` says `content-length: 150000` and sends 150000
/// bytes (the rest of the representation, then 50000 more). The caller gets 250000 bytes for
/// a 200000-byte representation, with a clean end (2 requests, 1 range request).
///
/// Fix: as above: require the `206`'s exact size hint to be `last - first + 1`, and never
/// deliver past the expected end (cut the frame at `total - received`, then end or fail).
///
/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn a_206_longer_than_its_content_range_is_not_delivered() {
    let whole = rep(BIG, 1);
    let w = whole.clone();
    let server = Raw::start(move |_, seen| match seen.range {
        None => vec![
            Act::W(head("200 OK", &[cl(BIG), "etag: \"v1\"".into()])),
            Act::W(w[..HALF].to_vec()),
            Act::Close,
        ],
        Some(from) => {
            let from = from as usize;
            let mut long = w[from..].to_vec();
            long.extend_from_slice(&rep(50_000, 9));
            vec![
                Act::W(head(
                    "206 Partial Content",
                    &[
                        format!("content-range: bytes {from}-{}/{BIG}", BIG - 1),
                        cl(long.len()),
                        "etag: \"v1\"".into(),
                    ],
                )),
                Act::W(long),
            ]
        }
    })
    .await;
    let res = stack(policy().build().unwrap())
        .oneshot(req(Method::GET, &server.url("/f"), None))
        .await
        .unwrap();
    let (bytes, err) = read_all(res.into_body()).await;
    assert_eq!(server.ranges(), 1);
    // Today: 250000 bytes, no error.
    assert_no_splice(&bytes, &err, &whole);
}

/// A `Last-Modified` validator, and a server (or a proxy in front of it) that serves ranges
/// but ignores `If-Range`: the representation changed between the attempts, and the `206`
/// says so with a new `Last-Modified`.
///
/// What happens: the first `GET` is a `200` without an ETag, `last-modified` a minute before
/// its `date` (a strong validator), cut after 100000 bytes. The range request is answered
/// `206` with the right `Content-Range` and length but `last-modified` an hour later and the
/// bytes of another version. `Expect::check` compares the `206`'s `ETag` only when the
/// validator was an ETag, and never its `Last-Modified`: the two versions are spliced (the
/// caller's bytes differ from the representation at offset 100000, clean end; 2 requests).
///
/// Fix: in `Expect::check`, when the validator is a date, require the `206`'s
/// `Last-Modified` to be present and equal to it (and, when the first response had an ETag,
/// the `206` to carry the same ETag, see the next test).
///
/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn a_206_with_a_changed_last_modified_is_never_spliced() {
    let whole = rep(BIG, 1);
    let w = whole.clone();
    let server = Raw::start(move |_, seen| match seen.range {
        None => vec![
            Act::W(head(
                "200 OK",
                &[
                    cl(BIG),
                    "last-modified: Sun, 06 Nov 1994 08:48:37 GMT".into(),
                    "date: Sun, 06 Nov 1994 08:49:37 GMT".into(),
                ],
            )),
            Act::W(w[..HALF].to_vec()),
            Act::Close,
        ],
        Some(from) => {
            let from = from as usize;
            let v2 = rep(BIG, 2);
            vec![
                Act::W(head(
                    "206 Partial Content",
                    &[
                        format!("content-range: bytes {from}-{}/{BIG}", BIG - 1),
                        cl(BIG - from),
                        "last-modified: Sun, 06 Nov 1994 09:48:37 GMT".into(),
                        "date: Sun, 06 Nov 1994 09:49:37 GMT".into(),
                    ],
                )),
                Act::W(v2[from..].to_vec()),
            ]
        }
    })
    .await;
    let res = stack(policy().build().unwrap())
        .oneshot(req(Method::GET, &server.url("/f"), None))
        .await
        .unwrap();
    let (bytes, err) = read_all(res.into_body()).await;
    assert_eq!(server.ranges(), 1);
    assert_no_splice(&bytes, &err, &whole);
}

/// A strong ETag, and a server that ignores `If-Range` and answers the range request with a
/// `206` of a new version that carries no `ETag` at all (RFC 9110 §15.3.7: a `206` MUST carry
/// the `ETag` a `200` would).
///
/// What happens: `Expect::check` only refuses a `206` whose `ETag` differs
/// (`headers.get(ETAG).is_some_and(|e| e != validator)`); a missing one passes, and version 2
/// is spliced after 100000 bytes of version 1 (2 requests, clean end).
///
/// Fix: when the validator is an ETag, require the `206` to carry it
/// (`headers.get(ETAG) == Some(&self.validator)`), else `NoResume::NotTheSame`.
///
/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn a_206_without_the_etag_is_never_spliced() {
    let whole = rep(BIG, 1);
    let w = whole.clone();
    let server = Raw::start(move |_, seen| match seen.range {
        None => vec![
            Act::W(head("200 OK", &[cl(BIG), "etag: \"v1\"".into()])),
            Act::W(w[..HALF].to_vec()),
            Act::Close,
        ],
        Some(from) => {
            let from = from as usize;
            let v2 = rep(BIG, 2);
            vec![
                Act::W(head(
                    "206 Partial Content",
                    &[
                        format!("content-range: bytes {from}-{}/{BIG}", BIG - 1),
                        cl(BIG - from),
                    ],
                )),
                Act::W(v2[from..].to_vec()),
            ]
        }
    })
    .await;
    let res = stack(policy().build().unwrap())
        .oneshot(req(Method::GET, &server.url("/f"), None))
        .await
        .unwrap();
    let (bytes, err) = read_all(res.into_body()).await;
    assert_eq!(server.ranges(), 1);
    assert_no_splice(&bytes, &err, &whole);
}

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

/// The reqwest adapter splices too: a `206` that omits the ETag, with another version's bytes.
/// Same defect and fix as `a_206_without_the_etag_is_never_spliced` (`Expect::check`).
///
/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn reqwest_a_206_without_the_etag_is_never_spliced() {
    let whole = rep(BIG, 1);
    let w = whole.clone();
    let server = Raw::start(move |_, seen| match seen.range {
        None => vec![
            Act::W(head("200 OK", &[cl(BIG), "etag: \"v1\"".into()])),
            Act::W(w[..HALF].to_vec()),
            Act::Close,
        ],
        Some(from) => {
            let from = from as usize;
            let v2 = rep(BIG, 2);
            vec![
                Act::W(head(
                    "206 Partial Content",
                    &[
                        format!("content-range: bytes {from}-{}/{BIG}", BIG - 1),
                        cl(BIG - from),
                    ],
                )),
                Act::W(v2[from..].to_vec()),
            ]
        }
    })
    .await;
    let res = reqwest_client(policy().build().unwrap())
        .get(server.url("/f"))
        .send()
        .await
        .unwrap();
    let (bytes, err) = reqwest_read_all(res).await;
    assert_eq!(server.ranges(), 1);
    let err: Option<BoxError> = err.map(|e| Box::new(e) as BoxError);
    assert_no_splice(&bytes, &err, &whole);
}

/// A `416` (or any answer but a `206`/`200`) to the range request.
///
/// What happens: nothing is spliced (1 range request, the caller has the first 100000 bytes and
/// an error), but `why_no_resume()` says `Refused` ("the retry policy refused another
/// attempt"): `poll_resume` hands a non-success status to the policy (`(Err(_), false) =>
/// self.phase = step`), which stops as `Final`, and `decide` maps every stop but the
/// not-idempotent ones to `Refused`. The docs of `NoResume::NotTheSame` say it covers "The
/// server answered the range request with something other than a matching 206"; the report's
/// stop reason is `Final`, not a refusal.
///
/// Fix: in `poll_resume`, when the status is not retryable and the policy stops with
/// `StopReason::Final`, fail with the `checked` reason (`NotTheSame`) instead of `Refused`.
///
/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn a_416_to_the_range_request_says_not_the_same() {
    let (_server, _bytes, err) = resume_against(
        "416 Range Not Satisfiable",
        vec![
            format!("content-range: bytes */{BIG}"),
            "etag: \"v1\"".into(),
        ],
        vec![],
    )
    .await;
    let err = err.expect("an error");
    assert_eq!(
        find_cut(&*err).unwrap().why_no_resume(),
        Some(NoResume::NotTheSame)
    );
}

/// The reqwest adapter: a body resumed with `Range` is recovered, and a report a reqwest caller
/// can reach counts the resume.
///
/// What happened: a 200000-byte `GET` cut after 100000 bytes was resumed (1 range request, the
/// caller got every byte), but `RetryReport::of_reqwest(&res)` is the head's report (1
/// attempt), and `WholeBody::report()` is out of reach inside a `reqwest::Body`. When resumes
/// stopped, the `BodyCutError` said `Refused` without the report either.
///
/// Fixed: a `BodyReport` handle in the response's extensions, which the resume updates after
/// each decision (`BodyReport::of_reqwest`), and the report in the `BodyCutError` when resumes
/// stop (see `reqwest_resumes_that_stop_say_why_in_the_error_report`).
///
/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn reqwest_resumes_are_counted_in_a_report_the_caller_can_read() {
    let whole = rep(BIG, 1);
    let w = whole.clone();
    let server = Raw::start(move |_, seen| match seen.range {
        None => vec![
            Act::W(head("200 OK", &[cl(BIG), "etag: \"v1\"".into()])),
            Act::W(w[..HALF].to_vec()),
            Act::Close,
        ],
        Some(from) => {
            let from = from as usize;
            vec![
                Act::W(head(
                    "206 Partial Content",
                    &[
                        format!("content-range: bytes {from}-{}/{BIG}", BIG - 1),
                        cl(BIG - from),
                        "etag: \"v1\"".into(),
                    ],
                )),
                Act::W(w[from..].to_vec()),
            ]
        }
    })
    .await;
    let mut res = reqwest_client(policy().build().unwrap())
        .get(server.url("/f"))
        .send()
        .await
        .unwrap();
    let mut bytes = Vec::new();
    while let Some(chunk) = res.chunk().await.unwrap() {
        bytes.extend_from_slice(&chunk);
    }
    assert_eq!(bytes, whole);
    assert_eq!(server.ranges(), 1);
    // The head's report stops at the head; the body's counts the resume.
    assert_eq!(
        RetryReport::of_reqwest(&res).expect("a report").attempts(),
        1
    );
    let report = BodyReport::of_reqwest(&res)
        .expect("a body that may resume has a body report")
        .get()
        .expect("the body was cut");
    assert_eq!(report.attempts(), 2, "the resume is not counted");
    let first = report.attempt_outcomes().next().expect("a record");
    assert_eq!(first.body_cut_after(), Some(HALF as u64));
}

/// Resumes that stop (every range request cut after 0 bytes) end the reqwest body in an error
/// whose `BodyCutError` carries the report: the attempts, and why they stopped.
///
/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn reqwest_resumes_that_stop_say_why_in_the_error_report() {
    let whole = rep(BIG, 1);
    let w = whole.clone();
    let server = Raw::start(move |_, seen| match seen.range {
        None => vec![
            Act::W(head("200 OK", &[cl(BIG), "etag: \"v1\"".into()])),
            Act::W(w[..HALF].to_vec()),
            Act::Close,
        ],
        Some(from) => {
            let from = from as usize;
            vec![
                Act::W(head(
                    "206 Partial Content",
                    &[
                        format!("content-range: bytes {from}-{}/{BIG}", BIG - 1),
                        cl(BIG - from),
                        "etag: \"v1\"".into(),
                    ],
                )),
                Act::Close,
            ]
        }
    })
    .await;
    let mut res = reqwest_client(policy().max_retries(2).build().unwrap())
        .get(server.url("/f"))
        .send()
        .await
        .unwrap();
    let handle = BodyReport::of_reqwest(&res)
        .cloned()
        .expect("a body report");
    let mut got = 0;
    let err = loop {
        match res.chunk().await {
            Ok(Some(chunk)) => got += chunk.len(),
            Ok(None) => panic!("the body ended whole though every resume was cut"),
            Err(err) => break err,
        }
    };
    assert_eq!(got, HALF);
    assert_eq!(server.ranges(), 2);
    let cut = find_cut(&err).expect("a BodyCutError in the chain");
    assert_eq!(cut.why_no_resume(), Some(NoResume::Refused));
    let report = cut.report().expect("the error carries the report");
    assert_eq!(report.attempts(), 3);
    assert_eq!(report.stop_reason(), StopReason::RetriesExhausted);
    assert_eq!(handle.get().expect("published").attempts(), 3);
}

/// A response that the server marks final (`x-should-retry: false`, "makes any response
/// final"), whose small body is cut.
///
/// What happens: a `GET` answered `503` with `x-should-retry: false` and a 1000-byte body is
/// final when whole (1 request). Cut after 500 bytes (every time), it is read again until
/// retries are used up: 6 requests for `max_retries(5)`, against the server's explicit word.
/// `Attempts::on_response` goes to `on_body_cut` before the status and headers are classified,
/// and `on_body_cut` classifies every cut `Ambiguous`, so the hint (and a replay marker,
/// `idempotent-replayed: true`, which is final too) is never read for a cut body.
///
/// Fix: in `on_response`, classify the status and headers first; when the classification is
/// final because of the server's hint or a replay marker, stop (the body ends in its
/// `BodyCutError`); only otherwise call `on_body_cut`.
///
/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn a_cut_response_the_server_marks_final_is_not_read_again() {
    let server = Raw::start(|_, _| {
        vec![
            Act::W(head(
                "503 Service Unavailable",
                &[cl(1000), "x-should-retry: false".into()],
            )),
            Act::W(rep(500, 1)),
            Act::Close,
        ]
    })
    .await;
    let res = stack(policy().build().unwrap())
        .oneshot(req(Method::GET, &server.url("/f"), None))
        .await
        .unwrap();
    let _ = read_all(res.into_body()).await;
    assert_eq!(server.requests(), 1);
}

/// Same root cause: a cut `503` with `Retry-After: 2` is read again after the policy's backoff
/// (1-5 ms here), not after the 2 s the server asked for (`on_body_cut` passes `None` for
/// Retry-After). 2 requests within a few ms for `max_retries(1)`.
///
/// Fix: as above: classify the status and headers, and keep the classification's
/// `Retry-After` (`Classification::with_retry_after(FailureClass::Ambiguous, retry_after)`).
///
/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn a_cut_response_with_retry_after_is_not_read_again_sooner() {
    let server = Raw::start(|_, _| {
        vec![
            Act::W(head(
                "503 Service Unavailable",
                &[cl(1000), "retry-after: 2".into()],
            )),
            Act::W(rep(500, 1)),
            Act::Close,
        ]
    })
    .await;
    let start = Instant::now();
    let res = stack(policy().max_retries(1).build().unwrap())
        .oneshot(req(Method::GET, &server.url("/f"), None))
        .await
        .unwrap();
    let elapsed = start.elapsed();
    let _ = read_all(res.into_body()).await;
    assert!(
        server.requests() == 1 || elapsed >= Duration::from_secs(2),
        "{} requests in {elapsed:?}",
        server.requests()
    );
}

// =============================================================================================
// HELD: never twice.
// =============================================================================================

/// A write answered with a body of `len` bytes (content-length or chunked), cut after `at`.
fn cut_write(len: usize, at: usize, chunk: bool) -> impl Fn(u32, &Seen) -> Vec<Act> + Send + Sync {
    move |_, _| {
        let data = rep(len, 1);
        if chunk {
            vec![
                Act::W(head("200 OK", &["transfer-encoding: chunked".into()])),
                Act::W(chunked(&data[..at])),
                Act::Close,
            ]
        } else {
            vec![
                Act::W(head("200 OK", &[cl(len), "etag: \"v1\"".into()])),
                Act::W(data[..at].to_vec()),
                Act::Close,
            ]
        }
    }
}

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
    // With trust, the keyed write within the limit is sent again (the server would replay).
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
    // onto the server's replay: this server does not honour keys (it applies the write again
    // and marks no replay), so the body ends in the error and nothing is spliced.
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

/// A body that yields `at` bytes (with an exact length of `len`), then fails: hyper's HTTP/2
/// server then resets the stream.
struct FailAfter {
    data: Option<Bytes>,
    len: u64,
    /// A pause before the failure, so that the head and the data reach the client before
    /// the reset (h2 drops a stream's buffered head when its reset comes first).
    pause: Pin<Box<tokio::time::Sleep>>,
}

impl Body for FailAfter {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if let Some(d) = self.data.take().filter(|d| !d.is_empty()) {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        std::task::ready!(self.pause.as_mut().poll(_cx));
        Poll::Ready(Some(Err(std::io::Error::other("cut"))))
    }
    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.len)
    }
}

async fn h2_server(
    len: usize,
    at: usize,
    cut_first_only: bool,
) -> (
    std::net::SocketAddr,
    Arc<RawCounts>,
    tokio::task::JoinHandle<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counts = Arc::new(RawCounts::default());
    let c = counts.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let counts = c.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let counts = counts.clone();
                    async move {
                        let n = counts.requests.fetch_add(1, Ordering::SeqCst) + 1;
                        if req.method() != Method::GET {
                            counts.writes.fetch_add(1, Ordering::SeqCst);
                        }
                        let data = Bytes::from(rep(len, 1));
                        let upto = if n == 1 || !cut_first_only { at } else { len };
                        let body = FailAfter {
                            data: Some(data.slice(..upto)),
                            len: len as u64,
                            pause: Box::pin(tokio::time::sleep(Duration::from_millis(50))),
                        };
                        let body: http_body_util::combinators::UnsyncBoxBody<
                            Bytes,
                            std::io::Error,
                        > = if upto == len {
                            Full::new(data).map_err(|e| match e {}).boxed_unsync()
                        } else {
                            body.boxed_unsync()
                        };
                        Ok::<_, std::io::Error>(
                            Response::builder()
                                .header("content-length", len)
                                .body(body)
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, counts, task)
}

/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn h2_writes_whose_body_is_cut_are_sent_once_and_reads_are_read_again() {
    for (len, at) in [(1000, 0), (1000, 500), (BIG, HALF)] {
        let (addr, counts, task) = h2_server(len, at, true).await;
        let url = format!("http://{addr}/v1/send");
        // Cut before any data, hyper's server resets the stream before the head: the
        // request then fails as a whole (ambiguous, not retried).
        match h2_stack(policy().build().unwrap())
            .oneshot(req(Method::POST, &url, None))
            .await
        {
            Ok(res) => {
                let (bytes, err) = read_all(res.into_body()).await;
                assert!(err.is_some());
                assert_eq!(bytes.len(), at);
            }
            Err(err) => assert!(err.is_ambiguous() && at == 0, "{err:?}"),
        }
        assert_eq!(
            counts.writes.load(Ordering::SeqCst),
            1,
            "h2 POST {len} {at}"
        );
        assert_eq!(counts.requests.load(Ordering::SeqCst), 1);
        task.abort();
    }
    // A GET within the limit is read again over h2.
    let (addr, counts, task) = h2_server(1000, 500, true).await;
    let res = h2_stack(policy().build().unwrap())
        .oneshot(req(Method::GET, &format!("http://{addr}/f"), None))
        .await
        .unwrap();
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(bytes, rep(1000, 1));
    assert_eq!(counts.requests.load(Ordering::SeqCst), 2);
    task.abort();
}

/// An HTTP/2 server with ranges and `etag: "v1"`; the first response is cut after `HALF`.
async fn h2_range_server() -> (
    std::net::SocketAddr,
    Arc<RawCounts>,
    tokio::task::JoinHandle<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counts = Arc::new(RawCounts::default());
    let c = counts.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let counts = c.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let counts = counts.clone();
                    async move {
                        let n = counts.requests.fetch_add(1, Ordering::SeqCst) + 1;
                        let whole = Bytes::from(rep(BIG, 1));
                        let from = req
                            .headers()
                            .get("range")
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| {
                                v.strip_prefix("bytes=")?.strip_suffix('-')?.parse().ok()
                            });
                        let res = Response::builder().header("etag", "\"v1\"");
                        let (res, data) = match from {
                            Some(from) => {
                                counts.ranges.fetch_add(1, Ordering::SeqCst);
                                let from: usize = from;
                                (
                                    res.status(206).header(
                                        "content-range",
                                        format!("bytes {from}-{}/{BIG}", BIG - 1),
                                    ),
                                    whole.slice(from..),
                                )
                            }
                            None => (res, whole),
                        };
                        let len = data.len();
                        let body: http_body_util::combinators::UnsyncBoxBody<
                            Bytes,
                            std::io::Error,
                        > = if n == 1 {
                            FailAfter {
                                data: Some(data.slice(..HALF)),
                                len: len as u64,
                                pause: Box::pin(tokio::time::sleep(Duration::from_millis(50))),
                            }
                            .boxed_unsync()
                        } else {
                            Full::new(data).map_err(|e| match e {}).boxed_unsync()
                        };
                        Ok::<_, std::io::Error>(
                            res.header("content-length", len).body(body).unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, counts, task)
}

/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn h2_a_get_past_the_limit_is_resumed_with_range() {
    let (addr, counts, task) = h2_range_server().await;
    let res = h2_stack(policy().build().unwrap())
        .oneshot(req(Method::GET, &format!("http://{addr}/f"), None))
        .await
        .unwrap();
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(bytes, rep(BIG, 1));
    assert_eq!(counts.requests.load(Ordering::SeqCst), 2);
    assert_eq!(counts.ranges.load(Ordering::SeqCst), 1);
    task.abort();
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

// =============================================================================================
// HELD: never splice.
// =============================================================================================

/// The first `GET` (200, `content-length: 200000`, `etag: "v1"`) is cut after 100000 bytes; the
/// range request gets `answer` (head lines, body) and the test checks nothing was spliced.
async fn resume_against(
    status: &'static str,
    lines: Vec<String>,
    body: Vec<u8>,
) -> (Raw, Vec<u8>, Option<BoxError>) {
    let whole = rep(BIG, 1);
    let w = whole.clone();
    let server = Raw::start(move |_, seen| match seen.range {
        None => vec![
            Act::W(head("200 OK", &[cl(BIG), "etag: \"v1\"".into()])),
            Act::W(w[..HALF].to_vec()),
            Act::Close,
        ],
        Some(_) => {
            let mut lines = lines.clone();
            lines.push(cl(body.len()));
            vec![Act::W(head(status, &lines)), Act::W(body.clone())]
        }
    })
    .await;
    let res = stack(policy().build().unwrap())
        .oneshot(req(Method::GET, &server.url("/f"), None))
        .await
        .unwrap();
    let (bytes, err) = read_all(res.into_body()).await;
    assert_no_splice(&bytes, &err, &whole);
    (server, bytes, err)
}

/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn range_answers_that_do_not_continue_the_body_are_never_spliced() {
    let v2 = rep(BIG, 2);
    let tail = v2[HALF..].to_vec();
    let range = format!("content-range: bytes {HALF}-{}/{BIG}", BIG - 1);
    let cases: Vec<(&str, &'static str, Vec<String>, Vec<u8>)> = vec![
        (
            "weak etag",
            "206 Partial Content",
            vec![range.clone(), "etag: W/\"v1\"".into()],
            tail.clone(),
        ),
        (
            "other case",
            "206 Partial Content",
            vec![range.clone(), "etag: \"V1\"".into()],
            tail.clone(),
        ),
        (
            "unquoted",
            "206 Partial Content",
            vec![range.clone(), "etag: v1".into()],
            tail.clone(),
        ),
        (
            "changed",
            "206 Partial Content",
            vec![range.clone(), "etag: \"v2\"".into()],
            tail.clone(),
        ),
        ("200", "200 OK", vec!["etag: \"v1\"".into()], v2.clone()),
        (
            "start after",
            "206 Partial Content",
            vec![
                format!("content-range: bytes {}-{}/{BIG}", HALF + 10, BIG - 1),
                "etag: \"v1\"".into(),
            ],
            v2[HALF + 10..].to_vec(),
        ),
        (
            "total changed",
            "206 Partial Content",
            vec![
                format!("content-range: bytes {HALF}-{}/{}", BIG, BIG + 1),
                "etag: \"v1\"".into(),
            ],
            rep(BIG + 1, 2)[HALF..].to_vec(),
        ),
        (
            "unparseable",
            "206 Partial Content",
            vec!["content-range: bytes x-y/z".into(), "etag: \"v1\"".into()],
            tail.clone(),
        ),
        (
            "negative",
            "206 Partial Content",
            vec![
                format!("content-range: bytes -{HALF}-{}/{BIG}", BIG - 1),
                "etag: \"v1\"".into(),
            ],
            tail.clone(),
        ),
        (
            "overflow",
            "206 Partial Content",
            vec![
                "content-range: bytes 100000-18446744073709551615/18446744073709551616".into(),
                "etag: \"v1\"".into(),
            ],
            tail.clone(),
        ),
        (
            "u64 max",
            "206 Partial Content",
            vec![
                "content-range: bytes 0-18446744073709551614/18446744073709551615".into(),
                "etag: \"v1\"".into(),
            ],
            tail.clone(),
        ),
        (
            "star",
            "206 Partial Content",
            vec![
                format!("content-range: bytes {HALF}-{}/*", BIG - 1),
                "etag: \"v1\"".into(),
            ],
            tail.clone(),
        ),
        (
            "no content-range",
            "206 Partial Content",
            vec!["etag: \"v1\"".into()],
            tail.clone(),
        ),
        (
            "multipart",
            "206 Partial Content",
            vec![
                "content-type: multipart/byteranges; boundary=THIS".into(),
                "etag: \"v1\"".into(),
            ],
            b"--THIS\r\ncontent-range: bytes 100000-100001/200000\r\n\r\nzz\r\n--THIS--\r\n"
                .to_vec(),
        ),
        (
            "gzip",
            "206 Partial Content",
            vec![
                range.clone(),
                "etag: \"v1\"".into(),
                "content-encoding: gzip".into(),
            ],
            tail.clone(),
        ),
        (
            "416",
            "416 Range Not Satisfiable",
            vec![
                format!("content-range: bytes */{BIG}"),
                "etag: \"v1\"".into(),
            ],
            vec![],
        ),
        (
            "non-utf8 etag",
            "206 Partial Content",
            vec![range.clone(), "etag: \"v\u{e9}\"".into()],
            tail.clone(),
        ),
    ];
    for (what, status, lines, body) in cases {
        let (server, bytes, err) = resume_against(status, lines, body).await;
        let err = err.unwrap_or_else(|| panic!("{what}: no error"));
        let cut = find_cut(&*err).unwrap_or_else(|| panic!("{what}: {err}"));
        assert_eq!(bytes.len(), HALF, "{what}");
        assert_eq!(cut.bytes_received(), HALF as u64, "{what}");
        assert!(cut.why_no_resume().is_some(), "{what}");
        assert_eq!(server.ranges(), 1, "{what}");
    }
}

/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn a_weak_last_modified_within_the_same_second_is_no_validator() {
    let whole = rep(BIG, 1);
    let w = whole.clone();
    let server = Raw::start(move |_, seen| match seen.range {
        None => vec![
            Act::W(head(
                "200 OK",
                &[
                    cl(BIG),
                    "last-modified: Sun, 06 Nov 1994 08:49:37 GMT".into(),
                    "date: Sun, 06 Nov 1994 08:49:37 GMT".into(),
                ],
            )),
            Act::W(w[..HALF].to_vec()),
            Act::Close,
        ],
        Some(_) => vec![Act::W(head("500 Oops", &[cl(0)]))],
    })
    .await;
    let res = stack(policy().build().unwrap())
        .oneshot(req(Method::GET, &server.url("/f"), None))
        .await
        .unwrap();
    let (bytes, err) = read_all(res.into_body()).await;
    let err = err.unwrap();
    assert_eq!(
        find_cut(&*err).unwrap().why_no_resume(),
        Some(NoResume::NoValidator)
    );
    assert_eq!(bytes.len(), HALF);
    assert_eq!(server.ranges(), 0);
}

/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn malformed_first_heads_never_panic() {
    let cases: Vec<Vec<String>> = vec![
        vec!["etag: \"\u{e9}\u{ff}\"".into()],
        vec!["etag: \"".into()],
        vec!["etag: \"\"".into()],
        vec![
            "content-range: bytes 99999999999999999999999-1/2".into(),
            "etag: \"v1\"".into(),
        ],
        vec!["last-modified: \u{ff}\u{fe}".into(), "date: garbage".into()],
        vec!["etag: \"v1\"".into(), "content-encoding: \u{ff}".into()],
    ];
    for lines in cases {
        let whole = rep(BIG, 1);
        let w = whole.clone();
        let l2 = lines.clone();
        let server = Raw::start(move |_, seen| {
            let mut lines = l2.clone();
            lines.push(cl(BIG - seen.range.unwrap_or(0) as usize));
            match seen.range {
                None => vec![
                    Act::W(head("200 OK", &lines)),
                    Act::W(w[..HALF].to_vec()),
                    Act::Close,
                ],
                Some(from) => {
                    lines.push(format!("content-range: bytes {from}-{}/{BIG}", BIG - 1));
                    vec![
                        Act::W(head("206 Partial Content", &lines)),
                        Act::W(w[from as usize..].to_vec()),
                    ]
                }
            }
        })
        .await;
        let res = stack(policy().build().unwrap())
            .oneshot(req(Method::GET, &server.url("/f"), None))
            .await
            .unwrap();
        let (bytes, err) = read_all(res.into_body()).await;
        assert_no_splice(&bytes, &err, &whole);
        // A huge content-length on a small body (a lie): streamed, never buffered whole.
    }
    let server = Raw::start(|_, _| {
        vec![
            Act::W(head(
                "200 OK",
                &[
                    "content-length: 1000000000000000".into(),
                    "etag: \"v1\"".into(),
                ],
            )),
            Act::W(rep(1000, 1)),
            Act::Close,
        ]
    })
    .await;
    let res = tokio::time::timeout(
        Duration::from_secs(5),
        stack(policy().max_retries(2).build().unwrap()).oneshot(req(
            Method::GET,
            &server.url("/f"),
            None,
        )),
    )
    .await
    .expect("the head comes back: the body is not read in the attempt")
    .unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(10), read_all(res.into_body()))
        .await
        .expect("ends");
    assert!(server.ranges() <= 2);
}

// =============================================================================================
// HELD: budget, deadline, retries.
// =============================================================================================

/// Every response is cut after 0 bytes of its body (the first one, and every `206`).
async fn always_cut_at_zero() -> Raw {
    Raw::start(|_, seen| match seen.range {
        None => vec![
            Act::W(head("200 OK", &[cl(BIG), "etag: \"v1\"".into()])),
            Act::Close,
        ],
        Some(from) => vec![
            Act::W(head(
                "206 Partial Content",
                &[
                    format!("content-range: bytes {from}-{}/{BIG}", BIG - 1),
                    cl(BIG - from as usize),
                    "etag: \"v1\"".into(),
                ],
            )),
            Act::Close,
        ],
    })
    .await
}

/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn resumes_cut_after_zero_bytes_stop_at_max_retries() {
    let server = always_cut_at_zero().await;
    let res = stack(policy().max_retries(4).build().unwrap())
        .oneshot(req(Method::GET, &server.url("/f"), None))
        .await
        .unwrap();
    let (mut parts, body) = res.into_parts();
    let _ = parts.extensions.remove::<RetryReport>();
    let mut body = body;
    let mut bytes = 0;
    let err = loop {
        match body.frame().await {
            Some(Ok(f)) => bytes += f.data_ref().map_or(0, |d| d.len()),
            Some(Err(e)) => break e,
            None => panic!("clean end"),
        }
    };
    assert_eq!(bytes, 0);
    assert_eq!(
        find_cut(&*err).unwrap().why_no_resume(),
        Some(NoResume::Refused)
    );
    assert_eq!(server.ranges(), 4);
    assert_eq!(server.requests(), 5);
    let report = body.report().expect("report");
    assert_eq!(report.attempts(), 5);
    assert_eq!(report.stop_reason(), StopReason::RetriesExhausted);
}

struct Counted(AtomicU32, AtomicU32);
impl Budget for Counted {
    fn deposit(&self) {}
    fn withdraw(&self) -> bool {
        self.1.fetch_add(1, Ordering::SeqCst);
        self.0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn resumes_take_from_the_budget() {
    let server = always_cut_at_zero().await;
    let budget = Arc::new(Counted(AtomicU32::new(2), AtomicU32::new(0)));
    struct Shared(Arc<Counted>);
    impl Budget for Shared {
        fn deposit(&self) {}
        fn withdraw(&self) -> bool {
            self.0.withdraw()
        }
    }
    let policy = RetryPolicy::builder()
        .max_retries(50)
        .backoff(Duration::from_millis(1), Duration::from_millis(2))
        .budget(Shared(budget.clone()))
        .build()
        .unwrap();
    let res = stack(policy)
        .oneshot(req(Method::GET, &server.url("/f"), None))
        .await
        .unwrap();
    let mut body = res.into_body();
    let (_, err) = read_all(&mut body).await;
    assert!(err.is_some());
    assert_eq!(server.ranges(), 2);
    assert_eq!(budget.1.load(Ordering::SeqCst), 3);
    assert_eq!(body.report().unwrap().stop_reason(), StopReason::Budget);
}

/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn resumes_obey_the_deadline() {
    let server = always_cut_at_zero().await;
    let policy = RetryPolicy::builder()
        .max_retries(100)
        .backoff(Duration::from_millis(40), Duration::from_millis(40))
        .no_budget()
        .deadline(Duration::from_millis(400))
        .build()
        .unwrap();
    let start = Instant::now();
    let res = stack(policy)
        .oneshot(req(Method::GET, &server.url("/f"), None))
        .await
        .unwrap();
    let (_, err) = read_all(res.into_body()).await;
    assert!(err.is_some());
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    assert!(server.ranges() <= 12, "{}", server.ranges());
}

// =============================================================================================
// HELD: secrets, memory, opt-out.
// =============================================================================================

/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn no_query_or_header_value_in_cut_errors() {
    // Within the limit (write, not re-sent), past the limit (a changed ETag), and the reqwest
    // adapter.
    for (len, at) in [(1000, 500), (BIG, HALF)] {
        let server = Raw::start(cut_write(len, at, false)).await;
        let mut r = req(Method::POST, &server.url("/v1/send?token=SEKRET-Q"), None);
        r.headers_mut()
            .insert("authorization", "Bearer SEKRET-H".parse().unwrap());
        let res = stack(policy().build().unwrap()).oneshot(r).await.unwrap();
        let debug = format!("{res:?}");
        let (_, err) = read_all(res.into_body()).await;
        let said = all_said(&*err.unwrap()) + &debug;
        assert!(!said.contains("SEKRET"), "{said}");
        let client = reqwest_client(policy().build().unwrap());
        let res = client
            .get(server.url("/f?token=SEKRET-Q"))
            .header("authorization", "Bearer SEKRET-H")
            .send()
            .await
            .unwrap();
        let (_, err) = reqwest_read_all(res).await;
        let said = all_said(&err.unwrap());
        assert!(!said.contains("SEKRET"), "{said}");
    }
    let (_, _, err) = resume_against(
        "206 Partial Content",
        vec![
            format!("content-range: bytes {HALF}-{}/{BIG}", BIG - 1),
            "etag: \"SEKRET-E\"".into(),
        ],
        rep(BIG - HALF, 2),
    )
    .await;
    let said = all_said(&*err.unwrap());
    assert!(!said.contains("SEKRET"), "{said}");
}

/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn an_endless_chunked_body_is_streamed_not_buffered() {
    let server = Raw::start(|_, _| {
        let mut acts = vec![Act::W(head(
            "200 OK",
            &["transfer-encoding: chunked".into()],
        ))];
        for _ in 0..2000 {
            acts.push(Act::W(chunked(&[b'x'; 4096])));
        }
        acts.push(Act::Pause(60_000));
        acts
    })
    .await;
    let res = tokio::time::timeout(
        Duration::from_secs(5),
        stack(policy().build().unwrap()).oneshot(req(Method::GET, &server.url("/f"), None)),
    )
    .await
    .expect("the head comes back without the body being read")
    .unwrap();
    assert!(res.body().size_hint().exact().is_none());
}

/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn a_lying_content_length_is_read_no_further() {
    let server = Raw::start(|_, _| {
        vec![
            Act::W(head("200 OK", &[cl(100)])),
            Act::W(vec![b'x'; 1_000_000]),
            Act::Pause(2_000),
        ]
    })
    .await;
    let res = stack(policy().build().unwrap())
        .oneshot(req(Method::GET, &server.url("/f"), None))
        .await
        .unwrap();
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(err.is_none());
    assert_eq!(bytes.len(), 100);
}

/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn without_the_layer_nothing_changes() {
    let server = Raw::start(cut_write(1000, 500, false)).await;
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let svc = ServiceBuilder::new()
        .layer(policy().build().unwrap())
        .service(client);
    let res: Response<Incoming> = svc
        .oneshot(req(Method::GET, &server.url("/f"), None))
        .await
        .unwrap();
    let (_, err) = read_all(res.into_body()).await;
    let err = err.unwrap();
    assert!(find_cut(&*err).is_none(), "{err:?}");
    assert_eq!(server.requests(), 1);
}

/// The request's deadline ends a healthy body that streams past it: the error says that the
/// client's deadline did, not that the server lost the rest (the review's observation).
///
/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn a_body_the_deadline_ends_says_the_deadline_did() {
    let whole = rep(BIG, 1);
    let w = whole.clone();
    let server = Raw::start(move |_, _| {
        vec![
            Act::W(head("200 OK", &[cl(BIG), "etag: \"v1\"".into()])),
            Act::W(w[..HALF].to_vec()),
            Act::Pause(3_000),
            Act::W(w[HALF..].to_vec()),
        ]
    })
    .await;
    let policy = policy()
        .deadline(Duration::from_millis(500))
        .build()
        .unwrap();
    let res = stack(policy)
        .oneshot(req(Method::GET, &server.url("/f"), None))
        .await
        .unwrap();
    let (bytes, err) = read_all(res.into_body()).await;
    let err = err.expect("the deadline ends the body");
    let cut = find_cut(&*err).expect("a BodyCutError");
    assert!(cut.is_deadline(), "{cut}");
    assert_eq!(bytes, whole[..bytes.len()]);
    let said = cut.to_string();
    assert!(said.contains("by the request's deadline"), "{said}");
    assert!(
        !said.contains("only the rest of the body was lost"),
        "{said}"
    );
    assert_eq!(server.ranges(), 0);
}
