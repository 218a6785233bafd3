//! `BodyCutError` (with its sources and its report) and `BodyReport` hold no URL, header value
//! or body byte, through tower and the reqwest adapter.
//!
//! Found by the adversarial review, round 2, of reading whole bodies (issue 23).

use std::sync::Arc;

use super::REPLAYED;
use crate::read_whole_reqwest::{all_said, reqwest_client, reqwest_read_all, BIG, HALF};
use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use retry_safety_testing::raw_server::{cl, head, Act, Raw};
use retry_safety_testing::read_whole::{find_cut, policy, read_all, stack};
use tower::ServiceExt;
use tower_retry_safety::resume::{BodyReport, NoResume};

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
