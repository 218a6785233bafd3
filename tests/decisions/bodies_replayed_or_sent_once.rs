//! The layer over a scripted inner service, with paused tokio time: streaming bodies sent once
//! (and the error that says so), replayable bodies replayed, every attempt the same request,
//! and the attempt header that counts them.

use crate::scripted_layer::{builder, get, run};
use bytes::Bytes;
use http::Request;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use retry_safety_testing::script::{ok, status, Refused, Reset, Script};
use tower::{Layer, ServiceExt};
use tower_retry_safety::service::NotReplayable;
use tower_retry_safety::{RetryReport, StopReason};

// --- bodies ---

#[tokio::test(start_paused = true)]
async fn streaming_body_is_sent_once_and_reported_when_the_replay_buffer_is_off() {
    let body = Full::new(Bytes::from_static(b"stream"))
        .map_err(|never| match never {})
        .boxed();
    let req = Request::get("http://api.test/v1/upload")
        .body(body)
        .unwrap();
    let script = Script::new([status(503), ok()]);
    let res = builder()
        .replay_buffer(0)
        .build()
        .unwrap()
        .layer(script.clone())
        .oneshot(req)
        .await
        .unwrap();
    assert_eq!(script.count(), 1);
    assert_eq!(res.status(), 503);
    let r = res.extensions().get::<RetryReport>().unwrap();
    assert_eq!(r.stop_reason(), StopReason::BodyNotReplayable);

    // A success through a streaming body is just final.
    let body: BoxBody<Bytes, std::convert::Infallible> = Full::new(Bytes::new()).boxed();
    let req = Request::get("http://api.test/v1/upload")
        .body(body)
        .unwrap();
    let script = Script::new([ok()]);
    let res = builder()
        .build()
        .unwrap()
        .layer(script.clone())
        .oneshot(req)
        .await
        .unwrap();
    assert_eq!(
        res.extensions().get::<RetryReport>().unwrap().stop_reason(),
        StopReason::Final
    );
}

#[tokio::test(start_paused = true)]
async fn streaming_post_after_refusal_is_an_error_that_says_not_replayable() {
    let (mut tx, body) = http_body_util::channel::Channel::<Bytes, std::io::Error>::new(1);
    tokio::spawn(async move { tx.send_data(Bytes::from_static(b"x")).await });
    let req = Request::post("http://api.test/v1/upload")
        .body(body)
        .unwrap();
    let script = Script::new([Refused, ok()]);
    let err = builder()
        .build()
        .unwrap()
        .layer(script.clone())
        .oneshot(req)
        .await
        .unwrap_err();
    assert_eq!(script.count(), 1);
    assert_eq!(err.stop_reason(), StopReason::BodyNotReplayable);
    assert_eq!(
        err.report().unwrap().body_not_replayable(),
        Some(NotReplayable::Stream)
    );
    assert!(err.is_not_sent());
    assert_eq!(
        err.to_string(),
        "POST /v1/upload was not retried: its body is a stream that is not recorded, and the \
         attempt never reached the server. It was never applied, so it is safe to send again."
    );
}

#[tokio::test(start_paused = true)]
async fn replayable_bodies_replay() {
    macro_rules! check {
        ($body:expr) => {{
            let req = Request::get("http://api.test/x").body($body).unwrap();
            let script = Script::new([Reset, ok()]);
            let res = builder()
                .build()
                .unwrap()
                .layer(script.clone())
                .oneshot(req)
                .await;
            assert_eq!(script.count(), 2, "{}", stringify!($body));
            assert_eq!(res.unwrap().status(), 200);
        }};
    }
    check!(Full::new(Bytes::from_static(b"x")));
    check!(http_body_util::Empty::<Bytes>::new());
    check!(String::from("x"));
    check!(b"x".to_vec());
    check!(Bytes::from_static(b"x"));
    check!(());
}

#[tokio::test(start_paused = true)]
async fn every_attempt_is_the_same_request() {
    // Not-sent failures: a POST is retried, so three attempts of one request.
    let script = Script::new([Refused, Refused, ok()]);
    let mut req = Request::post("https://api.test/v1/messages?draft=false&to=a")
        .version(http::Version::HTTP_2)
        .header("content-type", "application/json")
        .header("x-trace", "t-1")
        .body(String::from("{}"))
        .unwrap();
    req.extensions_mut()
        .insert(retry_safety_testing::script::Tag("caller"));
    let policy = builder().attempt_header(Some(http::HeaderName::from_static("x-attempt")));
    let res = run(policy, &script, req).await.unwrap();
    assert_eq!(res.status(), 200);
    let calls = script.calls();
    assert_eq!(calls.len(), 3);
    for (n, call) in calls.iter().enumerate() {
        assert_eq!(call.method, http::Method::POST, "attempt {}", n + 1);
        assert_eq!(
            call.uri.to_string(),
            "https://api.test/v1/messages?draft=false&to=a",
            "attempt {}",
            n + 1
        );
        assert_eq!(call.version, http::Version::HTTP_2);
        assert_eq!(call.headers["content-type"], "application/json");
        assert_eq!(call.headers["x-trace"], "t-1");
        assert_eq!(call.headers["x-attempt"], (n + 1).to_string().as_str());
        assert_eq!(call.headers.len(), 3, "{:?}", call.headers);
        assert_eq!(call.tag, Some(retry_safety_testing::script::Tag("caller")));
    }
}

// --- attempt header ---

#[tokio::test(start_paused = true)]
async fn attempt_header_counts_attempts() {
    let policy = builder().attempt_header(Some("x-attempt".parse().unwrap()));
    let script = Script::new([Reset, Refused, ok()]);
    run(policy, &script, get()).await.unwrap();
    let seen: Vec<_> = script
        .calls()
        .iter()
        .map(|c| c.headers["x-attempt"].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(seen, ["1", "2", "3"]);
    // Off by default.
    let script = Script::new([ok()]);
    run(builder(), &script, get()).await.unwrap();
    assert!(script.calls()[0].headers.get("x-attempt").is_none());
}
