//! Bodies cut mid-way through reqwest-middleware: `RetrySafetyMiddleware` then
//! `ReadWholeMiddleware`, against a real hyper server on loopback that cuts the first
//! responses' bodies and counts requests, writes applied and body bytes sent.

use std::error::Error as StdError;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use retry_safety_testing::cut_server::{Cut, CutServer, Options};
use tower_retry_safety::resume::{BodyCutError, NoResume, ReadWholeMiddleware};
use tower_retry_safety::{RetryPolicy, RetryReport, RetrySafetyMiddleware};

const MIB: usize = 1024 * 1024;

fn representation(len: usize) -> Bytes {
    (0..len)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

fn client(honor_keys: bool) -> ClientWithMiddleware {
    let policy = RetryPolicy::builder()
        .max_retries(3)
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .honor_idempotency_key(honor_keys)
        .no_budget()
        .build()
        .unwrap();
    let client = reqwest::Client::new();
    ClientBuilder::new(client.clone())
        .with(RetrySafetyMiddleware::new(policy))
        .with(ReadWholeMiddleware::new().resume_with(client))
        .build()
}

/// The body's bytes up to its end or its error.
async fn read_all(mut res: reqwest::Response) -> (Vec<u8>, Option<reqwest::Error>) {
    let mut bytes = Vec::new();
    loop {
        match res.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) => return (bytes, None),
            Err(err) => return (bytes, Some(err)),
        }
    }
}

fn cut_in(err: &reqwest::Error) -> &BodyCutError {
    let mut source: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(cut) = e.downcast_ref::<BodyCutError>() {
            return cut;
        }
        source = e.source();
    }
    panic!("no BodyCutError in {err:?}")
}

#[tokio::test]
async fn a_small_body_cut_half_way_is_read_again() {
    let body = representation(16 * 1024);
    let server = CutServer::start(Options::new(body.clone()), vec![Cut::At(8 * 1024)]).await;
    let url = server.url("/file?token=secret");
    let res = client(false).get(&url).send().await.expect("recovered");
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.url().as_str(), url);
    assert!(res.headers().contains_key("etag"));
    let report = RetryReport::of_reqwest(&res).expect("report").clone();
    assert_eq!(report.attempts(), 2);
    assert_eq!(
        report.attempt_outcomes().next().unwrap().body_cut_after(),
        Some(8 * 1024)
    );
    let (bytes, err) = read_all(res).await;
    assert!(err.is_none(), "{err:?}");
    assert!(bytes == body);
    assert_eq!(server.requests(), 2);
    assert_eq!(server.range_requests(), 0);
    assert_eq!(server.body_bytes(), 8 * 1024 + 16 * 1024);
}

#[tokio::test]
async fn an_unkeyed_post_whose_body_was_cut_is_never_sent_again() {
    let body = representation(16 * 1024);
    let server = CutServer::start(Options::new(body.clone()), vec![Cut::At(8 * 1024)]).await;
    let res = client(false)
        .post(server.url("/v1/messages?token=secret"))
        .body("{}")
        .send()
        .await
        .expect("the server answered");
    assert_eq!(res.status(), StatusCode::OK);
    // As through the tower layer: a write nothing makes safe to repeat is not read inside the
    // attempt (it would never be sent again): its body streams, and the report is the head's.
    let report = RetryReport::of_reqwest(&res).expect("report").clone();
    assert_eq!(report.attempts(), 1);
    assert!(report.may_have_been_applied());
    let (bytes, err) = read_all(res).await;
    let err = err.expect("the body ends in an error");
    let cut = cut_in(&err);
    assert_eq!(cut.status(), StatusCode::OK);
    assert_eq!(cut.bytes_received(), 8 * 1024);
    assert_eq!(cut.why_no_resume(), Some(NoResume::NotRepeatable));
    assert!(bytes[..] == body[..8 * 1024]);
    // The body error never prints the query string.
    let chain = format!("{err} {err:?} {cut} {cut:?}");
    assert!(!chain.contains("secret"), "{chain}");
    assert_eq!(server.requests(), 1);
    assert_eq!(server.applied(), 1);
}

#[tokio::test]
async fn a_10_mib_body_cut_half_way_is_resumed_with_range() {
    let body = representation(10 * MIB);
    let server = CutServer::start(Options::new(body.clone()), vec![Cut::At(5 * MIB)]).await;
    let url = server.url("/file");
    let res = client(false).get(&url).send().await.expect("a response");
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.url().as_str(), url);
    assert_eq!(res.headers()["etag"], "\"v1\"");
    let (bytes, err) = read_all(res).await;
    assert!(err.is_none(), "{err:?}");
    assert!(bytes == body, "the caller's bytes are the body");
    assert_eq!(server.requests(), 2);
    assert_eq!(server.range_requests(), 1);
    let wire = server.body_bytes();
    assert!(
        wire as f64 <= 1.05 * (10 * MIB) as f64,
        "{wire} bytes on the wire"
    );
}

#[tokio::test]
async fn a_changed_etag_gives_the_original_error_and_nothing_spliced() {
    let body = representation(MIB);
    let mut options = Options::new(body.clone());
    options.etag_changes = true;
    let server = CutServer::start(options, vec![Cut::At(300 * 1024)]).await;
    let res = client(false).get(server.url("/file")).send().await.unwrap();
    let (bytes, err) = read_all(res).await;
    let err = err.expect("the body ends in an error");
    assert_eq!(cut_in(&err).why_no_resume(), Some(NoResume::NotTheSame));
    assert!(bytes[..] == body[..bytes.len()]);
    assert_eq!(server.requests(), 2);
    assert_eq!(server.range_requests(), 1);
}
