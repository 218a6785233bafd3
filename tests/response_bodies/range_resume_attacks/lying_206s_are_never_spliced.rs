//! A `206` that lies about itself is never spliced onto the first response's bytes: shorter or
//! longer than its `Content-Range`, with a changed `Last-Modified`, or without the `ETag` (tower
//! and reqwest).
//!
//! Found by the adversarial review of reading whole bodies (issue 23).

use super::{assert_no_splice, chunked, policy, req};
use crate::read_whole_reqwest::{reqwest_client, reqwest_read_all, BIG, HALF};
use http::Method;
use retry_safety_testing::raw_server::{cl, head, rep, Act, Raw};
use retry_safety_testing::read_whole::{read_all, stack};
use tower::{BoxError, ServiceExt};

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
