//! Bodies cut mid-way, through the tower layer with `ReadWholeLayer` inside it, over
//! hyper-util's client, against a real hyper server on loopback that cuts or stalls the first
//! responses' bodies and counts requests, writes applied and body bytes sent.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use retry_safety_testing::cut_server::{Cut, CutServer, Options};
use retry_safety_testing::read_whole::{policy, read_all, representation, stack};
use tower::ServiceExt;
use tower_retry_safety::resume::{BodyCutError, NoResume, WholeBody};
use tower_retry_safety::{FailureClass, RetryReport, StopReason};

type Incoming = hyper::body::Incoming;

fn get(url: &str) -> Request<Full<Bytes>> {
    Request::get(url).body(Full::default()).unwrap()
}

fn post(url: &str, key: Option<&str>) -> Request<Full<Bytes>> {
    let mut req = Request::builder().method(Method::POST).uri(url);
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    req.body(Full::new(Bytes::from_static(b"{\"to\":\"a@example.com\"}")))
        .unwrap()
}

async fn send_get_cut(cut: Cut) -> (CutServer, Response<WholeBody<Incoming>>) {
    let body = representation(16 * 1024);
    let server = CutServer::start(Options::new(body), vec![cut]).await;
    let svc = stack(policy().build().unwrap());
    let res = svc
        .oneshot(get(&server.url("/file")))
        .await
        .expect("recovered");
    (server, res)
}

#[tokio::test]
async fn small_body_cut_right_after_the_head_is_read_again() {
    let (server, res) = send_get_cut(Cut::At(0)).await;
    let report = RetryReport::of(&res).expect("report").clone();
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(bytes, representation(16 * 1024));
    assert_eq!(server.requests(), 2);
    assert_eq!(server.body_bytes(), 16 * 1024);
    assert_eq!(report.attempts(), 2);
    let first = report.attempt_outcomes().next().unwrap();
    assert_eq!(first.class(), FailureClass::Ambiguous);
    assert_eq!(first.status(), Some(StatusCode::OK));
    assert_eq!(first.body_cut_after(), Some(0));
    assert_eq!(report.stop_reason(), StopReason::Final);
}

#[tokio::test]
async fn small_body_cut_half_way_is_read_again() {
    let (server, res) = send_get_cut(Cut::At(8 * 1024)).await;
    let report = RetryReport::of(&res).expect("report").clone();
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(bytes, representation(16 * 1024));
    assert_eq!(server.requests(), 2);
    assert_eq!(server.body_bytes(), 8 * 1024 + 16 * 1024);
    assert_eq!(report.attempts(), 2);
    let first = report.attempt_outcomes().next().unwrap();
    assert_eq!(first.body_cut_after(), Some(8 * 1024));
}

#[tokio::test]
async fn small_body_that_stalls_past_the_attempt_timeout_is_read_again() {
    let body = representation(16 * 1024);
    let server = CutServer::start(Options::new(body), vec![Cut::StallAt(8 * 1024)]).await;
    let policy = policy()
        .attempt_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let res = stack(policy)
        .oneshot(get(&server.url("/file")))
        .await
        .expect("recovered");
    let report = RetryReport::of(&res).expect("report").clone();
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(bytes, representation(16 * 1024));
    assert_eq!(server.requests(), 2);
    assert_eq!(server.body_bytes(), 8 * 1024 + 16 * 1024);
    assert_eq!(report.attempts(), 2);
    let first = report.attempt_outcomes().next().unwrap();
    // The wait for a frame outlasted the per-attempt timeout: a body cut after the server
    // answered, which the error says was the attempt's clock.
    assert_eq!(first.class(), FailureClass::Ambiguous);
    assert_eq!(first.status(), Some(StatusCode::OK));
    assert_eq!(first.body_cut_after(), Some(8 * 1024));
}

#[tokio::test]
async fn a_body_cut_on_every_attempt_stops_when_retries_are_used_up() {
    let body = representation(16 * 1024);
    let plan = vec![Cut::At(1000); 4];
    let server = CutServer::start(Options::new(body.clone()), plan).await;
    let policy = policy().max_retries(2).build().unwrap();
    let res = stack(policy)
        .oneshot(get(&server.url("/file")))
        .await
        .expect("the last response");
    assert_eq!(res.status(), StatusCode::OK);
    let report = RetryReport::of(&res).expect("report").clone();
    assert_eq!(report.attempts(), 3);
    assert_eq!(report.stop_reason(), StopReason::RetriesExhausted);
    let (bytes, err) = read_all(res.into_body()).await;
    let err = err.expect("the body ends in an error");
    let cut = err.downcast_ref::<BodyCutError>().expect("a BodyCutError");
    assert_eq!(cut.status(), StatusCode::OK);
    assert_eq!(cut.bytes_received(), 1000);
    // Nothing spliced: the caller has the last attempt's bytes, a prefix of the body.
    assert_eq!(bytes, body[..1000]);
    assert_eq!(server.requests(), 3);
    assert_eq!(server.body_bytes(), 3 * 1000);
}

#[tokio::test]
async fn an_unkeyed_post_whose_body_was_cut_is_never_sent_again() {
    let body = representation(16 * 1024);
    let server = CutServer::start(Options::new(body.clone()), vec![Cut::At(8 * 1024)]).await;
    let res = stack(policy().build().unwrap())
        .oneshot(post(&server.url("/v1/messages"), None))
        .await
        .expect("the server answered");
    assert_eq!(res.status(), StatusCode::OK);
    // A write nothing makes safe to repeat is not read inside the attempt (it would never be
    // sent again): its body streams, and the report is the head's.
    let report = RetryReport::of(&res).expect("report").clone();
    assert_eq!(report.attempts(), 1);
    assert!(report.may_have_been_applied());
    let (bytes, err) = read_all(res.into_body()).await;
    let err = err.expect("the body ends in an error");
    let cut = err.downcast_ref::<BodyCutError>().expect("a BodyCutError");
    assert_eq!(cut.status(), StatusCode::OK);
    assert_eq!(cut.bytes_received(), 8 * 1024);
    assert_eq!(cut.why_no_resume(), Some(NoResume::NotRepeatable));
    let message = cut.to_string();
    assert!(message.contains("200 OK"), "{message}");
    assert!(
        message.contains("only the rest of the body was lost"),
        "{message}"
    );
    assert_eq!(bytes, body[..8 * 1024]);
    assert_eq!(server.requests(), 1);
    assert_eq!(server.applied(), 1);
}

#[tokio::test]
async fn a_whole_body_costs_one_request() {
    let (server, res) = send_get_cut(Cut::None).await;
    let report = RetryReport::of(&res).expect("report").clone();
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(err.is_none());
    assert_eq!(bytes, representation(16 * 1024));
    assert_eq!(report.attempts(), 1);
    assert_eq!(server.requests(), 1);
    assert_eq!(server.body_bytes(), 16 * 1024);
}
