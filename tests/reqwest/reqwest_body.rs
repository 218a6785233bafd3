//! `reqwest::Body` behind the tower layer, through hyper-util's client, against the fault
//! server: a buffered body is replayed intact, a stream within the replay buffer too, a
//! larger stream is sent once.
#![cfg(feature = "reqwest-middleware")]

use bytes::Bytes;
use http::Request;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retry_safety_testing::fault_server::{Fault, FaultServer};
use tower::{Layer, ServiceExt};
use tower_retry_safety::service::NotReplayable;
use tower_retry_safety::{RetryPolicy, RetryReport, StopReason};

const PAYLOAD: &str = "{\"to\":\"a@example.com\",\"subject\":\"hello\"}";

fn put(url: String, fault: Fault, body: reqwest::Body) -> Request<reqwest::Body> {
    Request::put(url)
        .header("x-fault", fault.name())
        .body(body)
        .unwrap()
}

async fn send(req: Request<reqwest::Body>) -> http::Response<hyper::body::Incoming> {
    send_with(req, 64 * 1024).await
}

async fn send_with(
    req: Request<reqwest::Body>,
    replay_buffer: usize,
) -> http::Response<hyper::body::Incoming> {
    let policy = RetryPolicy::builder()
        .no_budget()
        .replay_buffer(replay_buffer)
        .build()
        .unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http::<reqwest::Body>();
    policy.layer(client).oneshot(req).await.unwrap()
}

#[tokio::test]
async fn a_buffered_put_is_retried_and_arrives_intact() {
    let server = FaultServer::start().await;
    // The first attempt is applied and its connection closed: ambiguous, and a PUT may be
    // repeated.
    let req = put(
        server.url("put-buffered"),
        Fault::DropAfterApply,
        reqwest::Body::from(PAYLOAD),
    );
    let res = send(req).await;
    assert_eq!(res.status(), 200);
    let report = RetryReport::of(&res).unwrap();
    assert_eq!(report.attempts(), 2);
    assert_eq!(report.stop_reason(), StopReason::Final);
    let stats = server.stats("put-buffered");
    assert_eq!(stats.attempts, 2);
    // Sending drains a reqwest body: only the layer's copy could carry the bytes again.
    assert_eq!(stats.body_len, PAYLOAD.len());
}

fn stream() -> reqwest::Body {
    let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
        Ok(Bytes::from_static(b"chunk-1,")),
        Ok(Bytes::from_static(b"chunk-2")),
    ];
    reqwest::Body::wrap_stream(futures_util::stream::iter(chunks))
}

#[tokio::test]
async fn a_streaming_put_is_recorded_retried_and_arrives_intact() {
    let server = FaultServer::start().await;
    let res = send(put(
        server.url("put-stream"),
        Fault::UnavailableAfterApply,
        stream(),
    ))
    .await;
    assert_eq!(res.status(), 200);
    let report = RetryReport::of(&res).unwrap();
    assert_eq!(report.attempts(), 2);
    let stats = server.stats("put-stream");
    assert_eq!(stats.attempts, 2);
    assert_eq!(stats.body_len, 15);
}

#[tokio::test]
async fn a_streaming_put_over_the_replay_buffer_is_sent_once_and_the_report_says_why() {
    let server = FaultServer::start().await;
    let res = send_with(
        put(
            server.url("put-stream"),
            Fault::UnavailableAfterApply,
            stream(),
        ),
        8,
    )
    .await;
    assert_eq!(res.status(), 503);
    let report = RetryReport::of(&res).unwrap();
    assert_eq!(report.attempts(), 1);
    assert_eq!(report.stop_reason(), StopReason::BodyNotReplayable);
    assert_eq!(
        report.body_not_replayable(),
        Some(NotReplayable::OverLimit { limit: 8 })
    );
    let stats = server.stats("put-stream");
    assert_eq!(stats.attempts, 1);
    assert_eq!(stats.body_len, 15);
}
