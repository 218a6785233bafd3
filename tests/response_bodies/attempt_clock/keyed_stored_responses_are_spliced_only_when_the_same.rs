//! Keyed writes past the read limit are sent again with their key and spliced only onto the
//! server's stored response of the same response: never after an unmarked `503` or `201` that follows a
//! stored response (tower and reqwest), a stored response that differs in any way, or a server that does not store responses;
//! a `409` then the stored response, and a cut stored response, continue the body; the policy's own key header is
//! honoured; odd `content-length`s on a stored response neither panic nor splice.
//!
//! Found by the adversarial review, round 2, of reading whole bodies (issue 23).

use std::sync::Arc;

use super::{assert_no_splice, cut_at, req, whole, HANG, REPLAYED};
use crate::read_whole_reqwest::{all_said, reqwest_client, reqwest_read_all, BIG, HALF};
use bytes::Bytes;
use http::{HeaderName, Method, Request};
use http_body_util::Full;
use retry_safety_testing::raw_server::{cl, head, rep, Act, Raw};
use retry_safety_testing::read_whole::{find_cut, policy, read_all, stack};
use tower::{BoxError, ServiceExt};
use tower_retry_safety::resume::{BodyReport, NoResume};
use tower_retry_safety::RetryReport;

/// **Splice.** A keyed write whose first answer was the server's stored response to a retryable status
/// (a `503` the server stored for the key, marked `idempotent-replayed: true`) and whose body,
/// past the limit, is cut; the write is sent again with its key and the answer is a `503` of
/// the same length that is NOT marked as a stored response (e.g. a proxy's or the application's own
/// error page of the same length, served without running the key's record): another response,
/// whose bytes are spliced onto the first. Inside the trust model (the key is trusted, the
/// server honours keys): the crate itself decides \"stored response\" from stale state.
///
/// What happened: 2 requests (the resend is allowed: the key is trusted). The resend's `503`
/// is classified retryable, so `Resume::decide` returns `Phase::Waiting` without
/// `set_stop`; `Attempts::last_stop` still holds `StopReason::StoredResponse` from the *first*
/// response (`continuation(reason)`), so `Resume::poll_resume` computes `stored = true`,
/// `check_replay` passes (same status, length, no ETag, no coding) and the caller reads
/// `rep(v1)[..100000] ++ rep(v2)[100000..]` as a whole body, no error.
///
/// Fixed (the fix proposed): compute `stored` from this response's own classification (the policy's stored-response mark
/// on `res.headers()`, e.g. a `Classification::is_stored_response` returned by the decision), or reset
/// `last_stop` before each decision so that a `Step::Wait` cannot leave a stale `Replayed`.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn a_stored_503_cut_then_an_unmarked_503_is_never_spliced() {
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
    // The unmarked 503 is not the stored response: never spliced, and (retryable, the key trusted) the
    // write is sent again until retries are used up: 1 + 3.
    assert_eq!(server.requests(), 4);
    assert_no_splice("stored 503", &bytes, &err, &rep(BIG, 1));
}

/// The same through the reqwest adapter.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn reqwest_a_stored_503_cut_then_an_unmarked_503_is_never_spliced() {
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
    assert_no_splice("reqwest stored 503", &bytes, &err, &rep(BIG, 1));
}

/// The counterpart of the open `503` defect: a first answer that is the server's stored response to a
/// `201` (marked), cut past the limit, then an unmarked `201` of the same length to the
/// resend: the resend's `Final` decision resets the stop reason, so it is not taken for the
/// stored response. Nothing spliced, `NotTheSame`, 2 requests.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn a_stored_201_cut_then_an_unmarked_201_is_never_spliced() {
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
    assert_no_splice("stored 201", &bytes, &err, &rep(BIG, 1));
    let err = err.expect("not the stored response");
    let cut = find_cut(&*err).expect("a BodyCutError");
    assert_eq!(cut.why_no_resume(), Some(NoResume::NotTheSame));
    assert_eq!(server.requests(), 2);
}

/// The first answer to a trusted keyed `POST` (`201`, 200000 bytes, ETag `"v1"`) is cut after
/// 100000 bytes; the resend's answer differs from the same response stored in one way
/// each time. Nothing is spliced: the body ends in `NotTheSame`, 2 requests.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn a_stored_response_that_differs_is_never_spliced() {
    let first = ["etag: \"v1\""];
    for (what, second) in stored_responses_that_differ() {
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

/// Answers to the resend that differ from the first answer stored in one way each.
fn stored_responses_that_differ() -> Vec<(&'static str, Vec<Act>)> {
    vec![
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
            "stored-response mark not `true`",
            whole(
                "201 Created",
                BIG,
                1,
                &["etag: \"v1\"", "idempotent-replayed: yes"],
            ),
        ),
    ]
}

/// A trusted key on `PATCH` (and `POST`) past the limit, against a server that does not honour
/// keys (it applies the write again, marks nothing): sent again once (the user said the server
/// honours keys), never with `Range`, and never spliced (`NotTheSame`).
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn a_trusted_keyed_write_to_a_server_that_does_not_store_responses_is_never_spliced() {
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
        let err = err.expect("not the stored response: the body ends in the error");
        let cut = find_cut(&*err).expect("a BodyCutError");
        assert_eq!(cut.why_no_resume(), Some(NoResume::NotTheSame));
        assert_eq!(server.writes(), 2, "{method}");
        assert_eq!(server.ranges(), 0, "{method}");
    }
}

/// The resend is first answered `409` (the key's first request still in flight), then with
/// the replay; and a replay whose own body is cut is followed by another: the body continues
/// each time from where it was, whole and unspliced, 3 requests.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn a_409_then_the_stored_response_and_a_cut_stored_response_then_the_stored_response_continue_the_body(
) {
    for (what, second) in [
        (
            "409 then the stored response",
            vec![
                Act::W(head("409 Conflict", &[cl(7), "retry-after: 0".to_string()])),
                Act::W(b"in use!".to_vec()),
            ],
        ),
        (
            "a stored response cut before the bytes delivered, then the stored response",
            cut_at(
                "201 Created",
                BIG,
                1,
                HALF - 50_000,
                &["etag: \"v1\"", REPLAYED],
            ),
        ),
        (
            "a cut stored response then the stored response",
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

/// **Weaker (a trusted keyed write never recovered).** A policy whose key header is not the
/// default name (`idempotency_key_header("x-idempotency-key")`) trusts the key, but
/// `ReadWhole` and `ReadWholeMiddleware` look for the literal `idempotency-key` header: the
/// keyed write past the limit is `NotRepeatable` (and within the limit it is streamed, never
/// read inside the attempt).
///
/// What happens: the first answer (`201`, 200000 bytes) is cut after 100000; a server that
/// honours keys would send its stored response (script: the second answer is the marked stored response); 1 request,
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

/// A stored response (or a first answer) whose `content-length` is odd: two values, leading zeros, a
/// sign, spaces. No panic, no hang, nothing spliced; at most 2 requests.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn odd_content_lengths_on_a_keyed_stored_response_neither_panic_nor_splice() {
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
