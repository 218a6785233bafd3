//! What a cut says and what is kept: no query or header value in cut errors, and a body the
//! deadline ends says the deadline did; an endless chunked body is streamed, not buffered; a lying
//! `Content-Length` is read no further; without `ReadWholeLayer` nothing changes.
//!
//! Found by the adversarial review of reading whole bodies (issue 23).

use std::time::Duration;

use super::{chunked, cut_write, policy, req, resume_against};
use crate::read_whole_reqwest::{all_said, reqwest_client, reqwest_read_all, BIG, HALF};
use bytes::Bytes;
use http::{Method, Response};
use http_body::Body;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use retry_safety_testing::raw_server::{cl, head, rep, Act, Raw};
use retry_safety_testing::read_whole::{find_cut, read_all, stack};
use tower::{ServiceBuilder, ServiceExt};

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
