//! Bodies past `ReadWholeLayer`'s limit, cut mid-way and resumed with `Range` + `If-Range`
//! through the tower layer over hyper-util's client, against a real hyper server on loopback
//! that counts requests, range requests and body bytes put on the wire.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use retry_safety_testing::cut_server::{Cut, CutServer, Options};
use retry_safety_testing::read_whole::{policy, read_all, representation, stack};
use tower::{BoxError, ServiceExt};
use tower_retry_safety::resume::{BodyCutError, NoResume, WholeBody};
use tower_retry_safety::{RetryPolicy, RetryReport, StopReason};

type Incoming = hyper::body::Incoming;

const MIB: usize = 1024 * 1024;

async fn get(
    options: Options,
    plan: Vec<Cut>,
    policy: RetryPolicy,
) -> (
    CutServer,
    Vec<u8>,
    Option<BoxError>,
    WholeBody<Incoming>,
    RetryReport,
) {
    let server = CutServer::start(options, plan).await;
    let req = Request::get(server.url("/file"))
        .body(Full::default())
        .unwrap();
    let res = stack(policy).oneshot(req).await.expect("a response");
    assert_eq!(res.status(), StatusCode::OK);
    let report = RetryReport::of(&res).expect("report").clone();
    let mut body = res.into_body();
    let (bytes, err) = read_all(&mut body).await;
    (server, bytes, err, body, report)
}

fn cut_of(err: &Option<BoxError>) -> &BodyCutError {
    err.as_ref()
        .expect("the body ends in an error")
        .downcast_ref::<BodyCutError>()
        .expect("a BodyCutError")
}

#[tokio::test]
async fn a_10_mib_body_cut_half_way_is_resumed_with_range() {
    let body = representation(10 * MIB);
    let options = Options::new(body.clone());
    let (server, bytes, err, whole, head_report) =
        get(options, vec![Cut::At(5 * MIB)], policy().build().unwrap()).await;
    assert!(err.is_none(), "{err:?}");
    assert!(bytes == body, "the caller's bytes are the body");
    assert_eq!(server.requests(), 2, "{:?}", whole.report());
    assert_eq!(server.range_requests(), 1);
    assert_eq!(whole.resumes(), 1);
    // The head's report: one attempt. The body's: the cut, then the range request.
    assert_eq!(head_report.attempts(), 1);
    let report = whole.report().expect("a resumed body has a report");
    assert_eq!(report.attempts(), 2);
    let cut_at = report.attempt_outcomes().next().unwrap().body_cut_after();
    let cut_at = cut_at.expect("the first attempt was cut");
    assert!(cut_at <= 5 * MIB as u64);
    assert_eq!(
        report.attempt_outcomes().nth(1).unwrap().status(),
        Some(StatusCode::PARTIAL_CONTENT)
    );
    // Bytes on the wire: what the first response sent, then the rest from where the caller's
    // bytes ended.
    let wire = server.body_bytes();
    assert_eq!(wire, 5 * MIB as u64 + (10 * MIB as u64 - cut_at));
    assert!(
        wire as f64 <= 1.05 * (10 * MIB) as f64,
        "{wire} bytes on the wire"
    );
}

#[tokio::test]
async fn a_body_cut_three_times_is_resumed_three_times() {
    let body = representation(4 * MIB);
    let plan = vec![Cut::At(MIB), Cut::At(MIB), Cut::At(MIB)];
    let (server, bytes, err, whole, _) =
        get(Options::new(body.clone()), plan, policy().build().unwrap()).await;
    assert!(err.is_none(), "{err:?}");
    assert!(bytes == body);
    assert_eq!(server.requests(), 4);
    assert_eq!(server.range_requests(), 3);
    assert_eq!(whole.resumes(), 3);
    assert_eq!(whole.report().unwrap().attempts(), 4);
}

#[tokio::test]
async fn a_superset_is_handled_by_skipping_what_was_delivered() {
    let body = representation(MIB);
    let mut options = Options::new(body.clone());
    options.superset = 1000;
    let (server, bytes, err, _, _) = get(
        options,
        vec![Cut::At(300 * 1024)],
        policy().build().unwrap(),
    )
    .await;
    assert!(err.is_none(), "{err:?}");
    assert!(bytes == body);
    assert_eq!(server.requests(), 2);
    assert_eq!(server.range_requests(), 1);
}

#[tokio::test]
async fn a_changed_etag_gives_the_original_error_and_nothing_spliced() {
    let body = representation(MIB);
    let mut options = Options::new(body.clone());
    options.etag_changes = true;
    let (server, bytes, err, _, _) = get(
        options,
        vec![Cut::At(300 * 1024)],
        policy().build().unwrap(),
    )
    .await;
    let cut = cut_of(&err);
    assert_eq!(cut.why_no_resume(), Some(NoResume::NotTheSame));
    assert_eq!(cut.status(), StatusCode::OK);
    assert_eq!(cut.bytes_received(), bytes.len() as u64);
    // The original cut is the source, not the second response.
    let source = std::error::Error::source(cut).expect("a source");
    assert!(
        source.downcast_ref::<hyper::Error>().is_some(),
        "{source:?}"
    );
    assert!(
        bytes[..] == body[..bytes.len()],
        "only the first response's bytes"
    );
    assert_eq!(server.requests(), 2);
    assert_eq!(server.range_requests(), 1);
}

#[tokio::test]
async fn a_server_without_range_support_gives_the_error_past_the_limit() {
    let body = representation(MIB);
    let mut options = Options::new(body.clone());
    options.ranges = false;
    let (server, bytes, err, _, _) = get(
        options,
        vec![Cut::At(300 * 1024)],
        policy().build().unwrap(),
    )
    .await;
    let cut = cut_of(&err);
    assert_eq!(cut.why_no_resume(), Some(NoResume::NotTheSame));
    assert!(bytes[..] == body[..bytes.len()]);
    assert_eq!(server.requests(), 2);
}

#[tokio::test]
async fn a_server_without_range_support_gives_a_whole_re_read_within_the_limit() {
    let body = representation(16 * 1024);
    let mut options = Options::new(body.clone());
    options.ranges = false;
    let (server, bytes, err, _, report) =
        get(options, vec![Cut::At(8 * 1024)], policy().build().unwrap()).await;
    assert!(err.is_none(), "{err:?}");
    assert!(bytes == body);
    assert_eq!(server.requests(), 2);
    assert_eq!(server.range_requests(), 0);
    assert_eq!(report.attempts(), 2);
}

#[tokio::test]
async fn no_validator_no_resume() {
    let body = representation(MIB);
    let mut options = Options::new(body.clone());
    options.etag = false;
    let (server, bytes, err, _, _) = get(
        options,
        vec![Cut::At(300 * 1024)],
        policy().build().unwrap(),
    )
    .await;
    assert_eq!(cut_of(&err).why_no_resume(), Some(NoResume::NoValidator));
    assert!(bytes[..] == body[..bytes.len()]);
    assert_eq!(server.requests(), 1);
}

#[tokio::test]
async fn a_weak_etag_is_no_validator() {
    let body = representation(MIB);
    let mut options = Options::new(body.clone());
    options.weak_etag = true;
    let (server, _, err, _, _) = get(
        options,
        vec![Cut::At(300 * 1024)],
        policy().build().unwrap(),
    )
    .await;
    assert_eq!(cut_of(&err).why_no_resume(), Some(NoResume::NoValidator));
    assert_eq!(server.requests(), 1);
}

#[tokio::test]
async fn resumes_stop_when_retries_are_used_up() {
    let body = representation(MIB);
    let plan = vec![Cut::At(300 * 1024), Cut::At(300 * 1024)];
    let policy = policy().max_retries(1).build().unwrap();
    let (server, bytes, err, whole, _) = get(Options::new(body.clone()), plan, policy).await;
    let cut = cut_of(&err);
    assert_eq!(cut.why_no_resume(), Some(NoResume::Refused));
    assert!(bytes[..] == body[..bytes.len()]);
    assert_eq!(server.requests(), 2);
    assert_eq!(server.range_requests(), 1);
    let report = whole.report().unwrap();
    assert_eq!(report.attempts(), 2);
    assert_eq!(report.stop_reason(), StopReason::RetriesExhausted);
}

#[tokio::test]
async fn an_unkeyed_post_past_the_limit_is_never_sent_again() {
    let body = representation(MIB);
    let server = CutServer::start(Options::new(body.clone()), vec![Cut::At(300 * 1024)]).await;
    let req = Request::builder()
        .method(Method::POST)
        .uri(server.url("/v1/export"))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let res = stack(policy().build().unwrap()).oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let (bytes, err) = read_all(res.into_body()).await;
    let cut = cut_of(&err);
    assert_eq!(cut.why_no_resume(), Some(NoResume::NotRepeatable));
    assert!(cut
        .to_string()
        .contains("only the rest of the body was lost"));
    assert!(bytes[..] == body[..bytes.len()]);
    assert_eq!(server.requests(), 1);
    assert_eq!(server.applied(), 1);
}

#[tokio::test]
async fn a_body_that_stalls_past_the_attempt_timeout_is_resumed() {
    let body = representation(MIB);
    let policy = policy()
        .attempt_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let (server, bytes, err, whole, _) = get(
        Options::new(body.clone()),
        vec![Cut::StallAt(300 * 1024)],
        policy,
    )
    .await;
    assert!(err.is_none(), "{err:?}");
    assert!(bytes == body);
    assert_eq!(server.requests(), 2);
    assert_eq!(server.range_requests(), 1);
    assert_eq!(whole.resumes(), 1);
    let report = whole.report().unwrap();
    assert_eq!(report.attempts(), 2);
    assert_eq!(
        report.attempt_outcomes().next().unwrap().body_cut_after(),
        Some(300 * 1024)
    );
}

#[tokio::test]
async fn a_body_that_streams_longer_than_the_attempt_timeout_without_stalling_is_not_cut() {
    // 20 frames of 16 KiB, 60 ms apart: the transfer takes longer than the 200 ms per-attempt
    // timeout, no wait for a frame does.
    let body = representation(320 * 1024);
    let mut options = Options::new(body.clone());
    options.pace = Some(Duration::from_millis(60));
    let policy = policy()
        .attempt_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let (server, bytes, err, whole, _) = get(options, vec![], policy).await;
    assert!(err.is_none(), "{err:?}");
    assert!(bytes == body);
    assert_eq!(server.requests(), 1);
    assert_eq!(whole.resumes(), 0);
}
