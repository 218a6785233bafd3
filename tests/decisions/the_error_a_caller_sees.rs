//! The layer over a scripted inner service, with paused tokio time: the error as a caller sees
//! it (its predicates, its display, what it never leaks, the request id, `NoRetry`'s advice).

use crate::scripted_layer::{builder, get, post, report, run};
use http::{Method, Request};
use retry_safety_testing::script::{ok, status, Refused, Reset, Script, Status, Timeout};
use tower_retry_safety::classify::VerdictSource;
use tower_retry_safety::{FailureClass, Idempotency, NoRetry, StopReason};

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
