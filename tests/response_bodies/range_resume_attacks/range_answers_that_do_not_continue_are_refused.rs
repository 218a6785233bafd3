//! Answers to the range request that do not continue the body (a `416`, a weak, changed or
//! missing `ETag`, a `200`, a wrong or unparseable `Content-Range`, a multipart or coded `206`)
//! end the body in a `BodyCutError` that says why, nothing spliced; a `Last-Modified` within the
//! same second as `Date` is no validator; malformed first heads never panic.
//!
//! Found by the adversarial review of reading whole bodies (issue 23).

use std::time::Duration;

use super::{assert_no_splice, policy, req, resume_against};
use crate::read_whole_reqwest::{BIG, HALF};
use http::Method;
use retry_safety_testing::raw_server::{cl, head, rep, Act, Raw};
use retry_safety_testing::read_whole::{find_cut, read_all, stack};
use tower::ServiceExt;
use tower_retry_safety::resume::NoResume;

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

/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn range_answers_that_do_not_continue_the_body_are_never_spliced() {
    let mut cases = answers_with_another_validator();
    cases.extend(answers_with_another_range());
    cases.extend(answers_with_a_malformed_range());
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

/// A range answer: what it is, its status line, its header lines and its body.
type RangeAnswer = (&'static str, &'static str, Vec<String>, Vec<u8>);

/// Answers to the range request whose validator is not the first response's strong ETag.
fn answers_with_another_validator() -> Vec<RangeAnswer> {
    let v2 = rep(BIG, 2);
    let tail = v2[HALF..].to_vec();
    let range = format!("content-range: bytes {HALF}-{}/{BIG}", BIG - 1);
    vec![
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
            "non-utf8 etag",
            "206 Partial Content",
            vec![range.clone(), "etag: \"v\u{e9}\"".into()],
            tail.clone(),
        ),
    ]
}

/// Answers to the range request whose range, encoding or status does not continue the body.
fn answers_with_another_range() -> Vec<RangeAnswer> {
    let v2 = rep(BIG, 2);
    let tail = v2[HALF..].to_vec();
    let range = format!("content-range: bytes {HALF}-{}/{BIG}", BIG - 1);
    vec![
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
    ]
}

/// Answers to the range request whose `Content-Range` is missing, unbounded or malformed.
fn answers_with_a_malformed_range() -> Vec<RangeAnswer> {
    let tail = rep(BIG, 2)[HALF..].to_vec();
    vec![
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
    ]
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
