//! The layer over a scripted inner service, with paused tokio time: every cell of the decision
//! table (the crate docs, "The decision model"), exact waits, budget, deadline, streaming
//! bodies, markers, stacked layers, cancel safety, readiness, and the error as a caller sees it.

use std::time::Duration;

use crate::support::script::{ok, status, Outcome, Refused, Reset, Script, Status, Timeout};
use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_retry_safety::{
    FailureClass, Idempotency, NoRetry, NotReplayable, RetryPolicy, RetryPolicyBuilder,
    RetryReport, StopReason, VerdictSource,
};

fn builder() -> RetryPolicyBuilder {
    RetryPolicy::builder()
        .jitter(false)
        .backoff(Duration::from_millis(500), Duration::from_secs(8))
        .no_budget()
}

fn get() -> Request<String> {
    Request::get("http://api.test/v1/things/1")
        .body(String::new())
        .unwrap()
}

fn post() -> Request<String> {
    Request::post("http://api.test/v1/tools/execute/GMAIL_SEND_EMAIL")
        .body("{\"to\":\"a@example.com\"}".to_owned())
        .unwrap()
}

fn no_retry_get() -> Request<String> {
    let mut r = get();
    r.extensions_mut().insert(NoRetry);
    r
}

type Out = Result<Response<String>, tower_retry_safety::Error>;

async fn run(policy: RetryPolicyBuilder, script: &Script, req: Request<String>) -> Out {
    policy
        .build()
        .unwrap()
        .layer(script.clone())
        .oneshot(req)
        .await
}

fn report(out: &Out) -> RetryReport {
    match out {
        Ok(res) => res.extensions().get::<RetryReport>().unwrap().clone(),
        Err(e) => e.report().unwrap().clone(),
    }
}

/// One cell: the first attempt ends in `first`, any later one succeeds.
async fn cell(req: Request<String>, first: Outcome) -> (usize, Out) {
    let script = Script::new([first, ok()]);
    let out = run(builder(), &script, req).await;
    (script.count(), out)
}

// --- the table: idempotent row ---

#[tokio::test(start_paused = true)]
async fn idempotent_not_sent_is_retried() {
    let (calls, out) = cell(get(), Refused).await;
    assert_eq!(calls, 2);
    assert_eq!(out.unwrap().status(), 200);
}

#[tokio::test(start_paused = true)]
async fn idempotent_ambiguous_is_retried() {
    for first in [Reset, Timeout] {
        let (calls, out) = cell(get(), first).await;
        assert_eq!(calls, 2);
        let r = report(&out);
        assert_eq!(r.attempts(), 2);
        let classes: Vec<_> = r.attempt_outcomes().map(|a| a.class()).collect();
        assert_eq!(classes, [FailureClass::Ambiguous, FailureClass::Final]);
    }
}

#[tokio::test(start_paused = true)]
async fn idempotent_retryable_response_is_retried() {
    for code in [408, 429, 500, 502, 503, 504] {
        let (calls, out) = cell(get(), status(code)).await;
        assert_eq!(calls, 2, "{code}");
        assert_eq!(out.unwrap().status(), 200);
    }
}

#[tokio::test(start_paused = true)]
async fn idempotent_final_is_returned() {
    let (calls, out) = cell(get(), status(404)).await;
    assert_eq!(calls, 1);
    let res = out.unwrap();
    assert_eq!(res.status(), 404);
    assert_eq!(report(&Ok(res)).stop_reason(), StopReason::Final);
}

// --- non-idempotent row ---

#[tokio::test(start_paused = true)]
async fn non_idempotent_not_sent_is_retried() {
    let (calls, out) = cell(post(), Refused).await;
    assert_eq!(calls, 2);
    assert_eq!(out.unwrap().status(), 200);
}

#[tokio::test(start_paused = true)]
async fn non_idempotent_ambiguous_is_suppressed() {
    for first in [Reset, Timeout] {
        let (calls, out) = cell(post(), first).await;
        assert_eq!(calls, 1);
        let err = out.unwrap_err();
        assert!(err.is_ambiguous());
        assert!(err.retry_suppressed());
        assert_eq!(err.stop_reason(), StopReason::SuppressedNotIdempotent);
    }
}

#[tokio::test(start_paused = true)]
async fn non_idempotent_retryable_response_is_suppressed_and_returned() {
    let (calls, out) = cell(post(), Status(429, vec![("retry-after", "0")])).await;
    assert_eq!(calls, 1);
    let res = out.unwrap();
    assert_eq!(res.status(), 429);
    let r = res.extensions().get::<RetryReport>().unwrap();
    assert!(r.retry_suppressed());
    assert_eq!(r.verdict().idempotency(), Idempotency::NonIdempotent);
    assert_eq!(r.verdict().source(), VerdictSource::Method);
}

#[tokio::test(start_paused = true)]
async fn non_idempotent_final_is_returned() {
    let (calls, out) = cell(post(), status(422)).await;
    assert_eq!(calls, 1);
    assert_eq!(report(&out).stop_reason(), StopReason::Final);
}

// --- NoRetry row ---

#[tokio::test(start_paused = true)]
async fn no_retry_is_returned_in_every_column() {
    for first in [Refused, Reset, status(503), status(404)] {
        let (calls, out) = cell(no_retry_get(), first.clone()).await;
        assert_eq!(calls, 1, "{first:?}");
        assert_eq!(
            report(&out).stop_reason(),
            StopReason::NoRetryMarker,
            "{first:?}"
        );
    }
}

// --- timing: backoff and Retry-After, exactly ---

#[tokio::test(start_paused = true)]
async fn backoff_doubles_without_jitter() {
    let script = Script::new([Refused, Refused, Refused, ok()]);
    let out = run(builder().max_retries(3), &script, get()).await;
    assert_eq!(script.call_times_ms(), [0, 500, 1500, 3500]);
    let delays: Vec<_> = report(&out).attempt_outcomes().map(|a| a.delay()).collect();
    let ms = |n| Some(Duration::from_millis(n));
    assert_eq!(delays, [ms(500), ms(1000), ms(2000), None]);
    assert_eq!(out.unwrap().status(), 200);
}

#[tokio::test(start_paused = true)]
async fn retry_after_delays_are_exact() {
    let script = Script::new([
        Status(503, vec![("retry-after", "7")]),
        Status(429, vec![("retry-after-ms", "1500")]),
        Status(503, vec![("retry-after", "not-a-number")]),
        ok(),
    ]);
    let out = run(builder().max_retries(3), &script, get()).await;
    // 7 s, then 1.5 s, then the third backoff step (2 s) because the hint was unreadable.
    assert_eq!(script.call_times_ms(), [0, 7000, 8500, 10500]);
    let r = report(&out);
    let delays: Vec<_> = r.attempt_outcomes().map(|a| a.delay()).collect();
    assert_eq!(
        delays,
        [
            Some(Duration::from_secs(7)),
            Some(Duration::from_millis(1500)),
            Some(Duration::from_secs(2)),
            None
        ]
    );
    let statuses: Vec<_> = r
        .attempt_outcomes()
        .map(|a| a.status().map(|s| s.as_u16()))
        .collect();
    assert_eq!(statuses, [Some(503), Some(429), Some(503), Some(200)]);
}

#[tokio::test(start_paused = true)]
async fn retry_after_above_the_cap_ends_the_retries() {
    let script = Script::new([Status(503, vec![("retry-after", "120")]), ok()]);
    let out = run(
        builder().max_retry_after(Duration::from_secs(60)),
        &script,
        get(),
    )
    .await;
    assert_eq!(script.count(), 1);
    let res = out.unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(
        res.extensions().get::<RetryReport>().unwrap().stop_reason(),
        StopReason::RetryAfterTooLong
    );
}

#[tokio::test(start_paused = true)]
async fn retries_exhausted_returns_the_last_response() {
    let script = Script::new([status(503), status(502), status(504), ok()]);
    let out = run(builder().max_retries(2), &script, get()).await;
    assert_eq!(script.count(), 3);
    let res = out.unwrap();
    assert_eq!(res.status(), 504);
    let r = res.extensions().get::<RetryReport>().unwrap();
    assert_eq!(r.stop_reason(), StopReason::RetriesExhausted);
    assert_eq!(r.attempts(), 3);
}

#[tokio::test(start_paused = true)]
async fn retries_exhausted_on_errors_is_an_error() {
    let script = Script::new([Reset, Reset, Reset]);
    let err = run(builder().max_retries(2), &script, get())
        .await
        .unwrap_err();
    assert_eq!(script.count(), 3);
    assert_eq!(err.attempts(), 3);
    assert!(err.is_ambiguous());
    assert_eq!(
        err.to_string(),
        "GET /v1/things/1 failed after 3 attempts (no retries were left): the last attempt \
         lost its connection after it was sent. Repeating it is harmless."
    );
}

// --- budget and deadline ---

#[tokio::test(start_paused = true)]
async fn budget_exhausted_stops_retries() {
    // No reserve and no share of deposits: the budget never allows a retry.
    let policy = builder().tps_budget(Duration::from_secs(10), 0, 0.0);
    let script = Script::new([status(503), ok()]);
    let out = run(policy, &script, get()).await;
    assert_eq!(script.count(), 1);
    assert_eq!(report(&out).stop_reason(), StopReason::Budget);
}

#[tokio::test(start_paused = true)]
async fn budget_is_shared_by_clones_and_spent_per_retry() {
    // Reserve: 1 retry/s over a 1 s window = 1 retry, and deposits earn nothing.
    let policy = builder()
        .tps_budget(Duration::from_secs(1), 1, 0.0)
        .build()
        .unwrap();
    let a = Script::new([status(503), ok()]);
    let b = Script::new([status(503), ok()]);
    let out_a = policy.clone().layer(a.clone()).oneshot(get()).await;
    let out_b = policy.layer(b.clone()).oneshot(get()).await;
    assert_eq!((a.count(), b.count()), (2, 1));
    assert_eq!(report(&out_a).stop_reason(), StopReason::Final);
    assert_eq!(report(&out_b).stop_reason(), StopReason::Budget);
}

#[tokio::test(start_paused = true)]
async fn deadline_stops_a_retry_that_would_end_past_it() {
    let policy = builder()
        .max_retries(5)
        .deadline(Duration::from_millis(1200));
    let script = Script::new([Refused, Refused, Refused, ok()]);
    let err = run(policy, &script, get()).await.unwrap_err();
    // 0 ms, 500 ms; the next wait (1 s) would end at 1.5 s, past the 1.2 s deadline.
    assert_eq!(script.call_times_ms(), [0, 500]);
    assert_eq!(err.stop_reason(), StopReason::Deadline);
    assert!(err.is_not_sent());
}

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
        .insert(crate::support::script::Tag("caller"));
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
        assert_eq!(call.tag, Some(crate::support::script::Tag("caller")));
    }
}

// --- stacked layers never compound ---

#[tokio::test(start_paused = true)]
async fn stacked_layers_make_at_most_max_retries_plus_one_attempts() {
    let script = Script::new(std::iter::repeat_n(status(503), 20));
    let outer = builder().max_retries(3).build().unwrap();
    let inner = builder().max_retries(3).build().unwrap();
    let svc = ServiceBuilder::new()
        .layer(outer)
        .layer(inner)
        .service(script.clone());
    let res = svc.oneshot(get()).await.unwrap();
    assert_eq!(script.count(), 4);
    let r = res.extensions().get::<RetryReport>().unwrap();
    assert_eq!(r.attempts(), 4);
    assert_eq!(r.stop_reason(), StopReason::RetriesExhausted);
}

#[tokio::test(start_paused = true)]
async fn stacked_layers_errors_are_not_double_wrapped() {
    let script = Script::new(std::iter::repeat_n(Reset, 10));
    let svc = ServiceBuilder::new()
        .layer(builder().max_retries(2).build().unwrap())
        .layer(builder().max_retries(2).build().unwrap())
        .service(script.clone());
    let err = svc.oneshot(get()).await.unwrap_err();
    assert_eq!(script.count(), 3);
    let source = std::error::Error::source(&err).unwrap();
    assert!(
        source.downcast_ref::<std::io::Error>().is_some(),
        "{source:?}"
    );
}

// --- cancel safety ---

#[tokio::test(start_paused = true)]
async fn dropping_the_future_during_backoff_sends_nothing_more() {
    let script = Script::new([Status(503, vec![("retry-after", "10")]), ok()]);
    let svc = builder().build().unwrap().layer(script.clone());
    let fut = svc.oneshot(get());
    // Let the first attempt run and the layer start its 10 s wait, then give up at 1 s.
    let out = tokio::time::timeout(Duration::from_secs(1), fut).await;
    assert!(out.is_err());
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(script.count(), 1);
}

// --- readiness ---

#[tokio::test(start_paused = true)]
async fn each_retry_waits_for_the_inner_service_to_be_ready() {
    // The script panics on a call without a prior Ready; Pending polls must be waited out.
    let script = Script::new([Reset, Reset, ok()]).pending_before_ready(3);
    let out = run(builder().max_retries(2), &script, get()).await;
    assert_eq!(out.unwrap().status(), 200);
    assert_eq!(script.count(), 3);
}

#[tokio::test(start_paused = true)]
async fn readiness_failure_before_a_retry_is_an_error_with_the_history() {
    let script = Script::new([status(503), ok()]).fail_ready_after_first();
    let mut svc = builder().build().unwrap().layer(script.clone());
    let err = ServiceExt::<Request<String>>::ready(&mut svc)
        .await
        .unwrap()
        .call(get())
        .await
        .unwrap_err();
    assert_eq!(script.count(), 1);
    assert_eq!(err.stop_reason(), StopReason::ServiceNotReady);
    assert_eq!(err.attempts(), 1);
    // The first attempt got a response: the request reached the server.
    assert!(err.is_ambiguous());
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

// --- the error as a caller sees it ---

#[tokio::test(start_paused = true)]
async fn suppressed_error_predicates_and_display() {
    let mut req = Request::post(
        "http://api.test/v1/tools/execute/GMAIL_SEND_EMAIL?api_key=sk-secret&to=a@example.com",
    )
    .header("x-request-id", "req-42")
    .header("idempotency-key", "\"key-7\"")
    .header("authorization", "Bearer sk-secret")
    .body("{\"secret\":\"body\"}".to_owned())
    .unwrap();
    req.extensions_mut().insert(Idempotency::NonIdempotent);
    let script = Script::new([Timeout, ok()]);
    let before = std::time::SystemTime::now();
    let err = run(builder(), &script, req).await.unwrap_err();
    assert_eq!(script.count(), 1);
    assert_eq!(
        err.to_string(),
        "POST /v1/tools/execute/GMAIL_SEND_EMAIL was not retried: it is not idempotent and the \
         attempt timed out after it was sent, so it may have been applied. Check the resource's \
         state on the server before retrying it by hand. It carried an idempotency key \
         that is not trusted for this target, so the key did not make a retry safe; see \
         `honor_idempotency_key_for_host`."
    );
    // The policy trusts no target with keys: the key was carried and ignored, and says so.
    assert!(err.idempotency_key_untrusted());
    assert!(err.report().unwrap().idempotency_key_untrusted());
    assert!(err.is_ambiguous());
    assert!(!err.is_not_sent());
    assert!(err.is_timeout());
    assert!(err.retry_suppressed());
    assert_eq!(err.attempts(), 1);
    assert_eq!(err.stop_reason(), StopReason::SuppressedNotIdempotent);
    assert_eq!(err.failure_class(), Some(FailureClass::Ambiguous));
    assert_eq!(err.request_id(), Some("req-42"));
    assert_eq!(err.idempotency_key(), Some("key-7"));
    assert_eq!(err.method(), Some(&Method::POST));
    assert_eq!(err.path(), Some("/v1/tools/execute/GMAIL_SEND_EMAIL"));
    assert_eq!(err.crate_version(), env!("CARGO_PKG_VERSION"));
    let first = err.first_attempt_at().unwrap();
    assert!(first >= before && err.last_attempt_at().unwrap() >= first);
    assert_eq!(
        err.report().unwrap().verdict().source(),
        VerdictSource::Marker
    );
    let source = std::error::Error::source(&err).unwrap();
    assert!(source.is::<tower::timeout::error::Elapsed>());
    for leak in ["sk-secret", "api_key", "body", "Bearer"] {
        assert!(!err.to_string().contains(leak), "{leak}");
        assert!(!format!("{err:?}").contains(leak), "{leak}");
    }
}

#[tokio::test(start_paused = true)]
async fn request_id_comes_from_the_response_when_the_request_has_none() {
    let script = Script::new([Status(200, vec![("x-request-id", "srv-9")])]);
    let out = run(builder(), &script, post()).await;
    assert_eq!(report(&out).request_id(), Some("srv-9"));
}

#[tokio::test(start_paused = true)]
async fn no_retry_error_says_what_to_do() {
    let err = run(builder(), &Script::new([Reset]), {
        let mut r = post();
        r.extensions_mut().insert(NoRetry);
        r
    })
    .await
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "POST /v1/tools/execute/GMAIL_SEND_EMAIL failed on its only attempt (it is marked \
         NoRetry): the attempt lost its connection after it was sent, so it may have been \
         applied. Check the resource's state on the server before retrying it by hand."
    );
}

#[tokio::test(start_paused = true)]
async fn an_earlier_response_makes_a_later_not_sent_error_ambiguous() {
    let script = Script::new([status(503), Refused]);
    let err = run(builder().max_retries(1), &script, get())
        .await
        .unwrap_err();
    assert_eq!(err.failure_class(), Some(FailureClass::NotSent));
    assert!(err.is_ambiguous());
}

/// An inner service whose readiness fails.
#[derive(Clone, Debug)]
struct FailReady;

impl Service<Request<String>> for FailReady {
    type Response = Response<String>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Response<String>, std::io::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Err(std::io::Error::other("pool closed")))
    }

    fn call(&mut self, _: Request<String>) -> Self::Future {
        std::future::ready(Err(std::io::Error::other("called without readiness")))
    }
}

#[tokio::test]
async fn inner_poll_ready_error_is_not_ready() {
    let mut svc = builder().build().unwrap().layer(FailReady);
    let err = ServiceExt::<Request<String>>::ready(&mut svc)
        .await
        .unwrap_err();
    assert_eq!(err.attempts(), 0);
    assert_eq!(err.stop_reason(), StopReason::ServiceNotReady);
    assert!(err.is_not_sent());
    assert!(err.to_string().contains("no request was handed to it"));
}

// --- composition: a total timeout outside, a per-attempt timeout inside ---

#[tokio::test(start_paused = true)]
async fn total_timeout_outside_and_per_attempt_timeout_inside() {
    let script = Script::new([Status(503, vec![("retry-after", "10")]), ok()]);
    let svc = ServiceBuilder::new()
        .timeout(Duration::from_secs(3)) // total, for all attempts
        .layer(builder().build().unwrap())
        .timeout(Duration::from_secs(1)) // per attempt
        .service(script.clone());
    let err = svc.oneshot(get()).await.unwrap_err();
    // The outer timeout fired during the 10 s wait; nothing more was sent.
    assert!(err.is::<tower::timeout::error::Elapsed>(), "{err:?}");
    assert_eq!(script.count(), 1);
}

// --- idempotency keys, client side ---

fn key_of(call: &crate::support::script::Call) -> Option<String> {
    call.headers
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap().to_owned())
}

#[tokio::test(start_paused = true)]
async fn a_minted_key_is_the_same_on_every_attempt_and_makes_a_write_retryable() {
    let script = Script::new([Timeout, Reset, ok()]);
    let res = run(builder().mint_idempotency_keys(true), &script, post())
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let keys: Vec<_> = script.calls().iter().map(key_of).collect();
    assert_eq!(keys.len(), 3);
    let key = keys[0].clone().unwrap();
    assert!(
        keys.iter().all(|k| k.as_deref() == Some(key.as_str())),
        "{keys:?}"
    );
    // An sf-string holding a UUID v4.
    let inner = key
        .strip_prefix('"')
        .and_then(|k| k.strip_suffix('"'))
        .unwrap();
    assert_eq!(inner.len(), 36);
    assert_eq!(inner.as_bytes()[14], b'4', "{inner}");
    let r = res.extensions().get::<RetryReport>().unwrap();
    assert_eq!(r.idempotency_key(), Some(inner));
    assert!(r.verdict().is_keyed());
}

#[tokio::test(start_paused = true)]
async fn minted_keys_differ_between_requests_and_reads_get_none() {
    let a = Script::new([ok()]);
    let b = Script::new([ok()]);
    let c = Script::new([ok()]);
    run(builder().mint_idempotency_keys(true), &a, post())
        .await
        .unwrap();
    run(builder().mint_idempotency_keys(true), &b, post())
        .await
        .unwrap();
    run(builder().mint_idempotency_keys(true), &c, get())
        .await
        .unwrap();
    assert_ne!(key_of(&a.calls()[0]), key_of(&b.calls()[0]));
    assert!(key_of(&a.calls()[0]).is_some());
    assert_eq!(key_of(&c.calls()[0]), None);
}

#[tokio::test(start_paused = true)]
async fn a_key_the_caller_set_is_never_replaced() {
    let mut req = post();
    req.headers_mut()
        .insert("idempotency-key", "\"caller-key-1\"".parse().unwrap());
    let script = Script::new([Reset, ok()]);
    let res = run(builder().mint_idempotency_keys(true), &script, req)
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let keys: Vec<_> = script.calls().iter().map(key_of).collect();
    assert_eq!(
        keys,
        [
            Some("\"caller-key-1\"".into()),
            Some("\"caller-key-1\"".into())
        ]
    );

    // A malformed key is not replaced either, and it does not count: the write is not retried.
    let mut req = post();
    req.headers_mut()
        .insert("idempotency-key", "\"unterminated".parse().unwrap());
    let script = Script::new([Reset, ok()]);
    let err = run(builder().mint_idempotency_keys(true), &script, req)
        .await
        .unwrap_err();
    assert!(err.retry_suppressed());
    assert_eq!(
        key_of(&script.calls()[0]).as_deref(),
        Some("\"unterminated")
    );
}

#[tokio::test(start_paused = true)]
async fn a_keyed_write_marked_non_idempotent_is_retried_only_where_its_host_is_trusted() {
    let marked = || {
        let mut req = post();
        req.extensions_mut().insert(Idempotency::NonIdempotent);
        req
    };
    // Unscoped trust (minting alone) yields to the marker: the endpoint may ignore keys.
    let script = Script::new([Timeout, ok()]);
    let err = run(builder().mint_idempotency_keys(true), &script, marked())
        .await
        .unwrap_err();
    assert!(err.retry_suppressed());
    assert_eq!(script.count(), 1);
    // Trust scoped to the host outweighs it: the key makes the repeat harmless.
    let script = Script::new([Timeout, ok()]);
    let trusted = builder()
        .mint_idempotency_keys(true)
        .honor_idempotency_key_for_host("API.test");
    let res = run(trusted, &script, marked()).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(script.count(), 2);
    assert_eq!(key_of(&script.calls()[0]), key_of(&script.calls()[1]));
}

#[tokio::test(start_paused = true)]
async fn conflict_on_a_keyed_request_is_retried_and_422_and_400_are_final() {
    let keyed = || {
        let mut r = post();
        r.headers_mut()
            .insert("idempotency-key", "\"k-409\"".parse().unwrap());
        r
    };
    let honour = || builder().honor_idempotency_key(true);
    let script = Script::new([Status(409, vec![("retry-after", "1")]), ok()]);
    let res = run(honour(), &script, keyed()).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(script.call_times_ms(), [0, 1000]);

    for code in [422, 400] {
        let script = Script::new([status(code), ok()]);
        let res = run(honour(), &script, keyed()).await.unwrap();
        assert_eq!(res.status(), code);
        assert_eq!(script.count(), 1);
    }
    // Without a key, a 409 is final.
    let script = Script::new([status(409), ok()]);
    let res = run(honour(), &script, get()).await.unwrap();
    assert_eq!(res.status(), 409);
    assert_eq!(script.count(), 1);
}

/// Host scoping through the layer: the same path is a write on one API, a PUT that may be
/// repeated on another.
#[tokio::test(start_paused = true)]
async fn a_rule_for_one_host_never_suppresses_a_retry_to_another() {
    let policy = || {
        builder().route_for_host(
            "api.a.test",
            Method::PUT,
            "/v1/send/{id}",
            Idempotency::NonIdempotent,
        )
    };
    let put = |host: &str| {
        Request::put(format!("http://{host}/v1/send/m1"))
            .body(String::new())
            .unwrap()
    };
    let script = Script::new([Reset, ok()]);
    let err = run(policy(), &script, put("api.a.test")).await.unwrap_err();
    assert!(err.retry_suppressed());
    assert_eq!(script.count(), 1);
    let script = Script::new([Reset, ok()]);
    let res = run(policy(), &script, put("api.b.test")).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(script.count(), 2);
}
