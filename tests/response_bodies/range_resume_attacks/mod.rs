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
//!
//! This module holds what the groups below share: the policy, the request, a write cut mid-body,
//! the range request answered by a script, and the check that nothing was spliced.

mod cut_errors_leak_nothing_and_bodies_stream;
mod cut_writes_are_sent_once;
mod h2_cut_writes_once_and_reads_recovered;
mod lying_206s_are_never_spliced;
mod range_answers_that_do_not_continue_are_refused;
mod resumes_are_bounded_and_reported;
mod slow_small_bodies_are_read_whole;

use std::time::Duration;

use crate::read_whole_reqwest::{BIG, HALF};
use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use retry_safety_testing::raw_server::{cl, head, rep, Act, Raw, Seen};
use retry_safety_testing::read_whole::{read_all, stack};
use tower::{BoxError, ServiceExt};
use tower_retry_safety::RetryPolicy;

pub(crate) fn chunked(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

pub(crate) fn policy() -> tower_retry_safety::RetryPolicyBuilder {
    RetryPolicy::builder()
        .max_retries(5)
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .no_budget()
}

pub(crate) fn req(method: Method, url: &str, key: Option<&str>) -> Request<Full<Bytes>> {
    let mut b = Request::builder().method(method).uri(url);
    if let Some(key) = key {
        b = b.header("idempotency-key", key);
    }
    b.body(Full::new(Bytes::from_static(b"{\"to\":\"a@example.com\"}")))
        .unwrap()
}

/// The caller's bytes are a prefix of `whole` (nothing spliced), ending in an error, or all of
/// `whole` without one.
pub(crate) fn assert_no_splice(bytes: &[u8], err: &Option<BoxError>, whole: &[u8]) {
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

/// A write answered with a body of `len` bytes (content-length or chunked), cut after `at`.
pub(crate) fn cut_write(
    len: usize,
    at: usize,
    chunk: bool,
) -> impl Fn(u32, &Seen) -> Vec<Act> + Send + Sync {
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

/// The first `GET` (200, `content-length: 200000`, `etag: "v1"`) is cut after 100000 bytes; the
/// range request gets `answer` (head lines, body) and the test checks nothing was spliced.
pub(crate) async fn resume_against(
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
