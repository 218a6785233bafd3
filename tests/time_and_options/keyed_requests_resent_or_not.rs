//! Keyed requests resent or not, against a recording inner service on paused time: a keyed read
//! keeps its method's verdict (and is hedged), a write by marker or route is never retried or
//! hedged unless its host is trusted, a 409 retried only where keys are trusted (a hedged keyed
//! PUT against the server's `IdempotencyLayer` is an end-to-end test,
//! `time_and_options/hedged_keyed_put.rs` in e2e/). From the review of 2026-12-04.

use retry_safety_testing::recording_service::{base, calls, recording};
use std::time::Duration;

use http::{Method, Request, StatusCode};
use tower::{Layer, ServiceExt};
use tower_retry_safety::{Hedge, Idempotency, RetryPolicyBuilder};

// ---------------------------------------------------------------------------------------
// 2. classify_parts: keyed reads keep the method's verdict; keyed writes by marker/route
// ---------------------------------------------------------------------------------------

fn keyed(method: Method, uri: &str) -> Request<String> {
    Request::builder()
        .method(method)
        .uri(uri)
        .header("idempotency-key", "\"k-1204\"")
        .body(String::from("{}"))
        .unwrap()
}

fn hedging() -> RetryPolicyBuilder {
    base().hedge(Hedge::fixed(Duration::from_millis(50)).max_extra_load(1.0))
}

/// A keyed GET (trusted) keeps source Method and is hedged: 2 calls. A keyed POST is
/// IdempotencyKey and not hedged without `keyed_writes`: 1 call.
///
/// Found by the review of 2026-12-04.
#[tokio::test(start_paused = true)]
async fn a_keyed_read_is_hedged_a_keyed_write_is_not() {
    use tower_retry_safety::classify::VerdictSource;
    let policy = hedging().honor_idempotency_key(true).build().unwrap();
    let get = keyed(Method::GET, "http://api.test/v1/things/1");
    let v = policy.classify(&get);
    assert_eq!(
        (v.source(), v.idempotency(), v.is_keyed()),
        (VerdictSource::Method, Idempotency::Idempotent, true)
    );
    let (svc, log) = recording(&[(10_000, 200), (0, 200)]);
    policy.clone().layer(svc).oneshot(get).await.unwrap();
    assert_eq!(calls(&log), 2);

    let post = keyed(Method::POST, "http://api.test/v1/things");
    let v = policy.classify(&post);
    assert_eq!(
        (v.source(), v.idempotency(), v.is_keyed()),
        (VerdictSource::IdempotencyKey, Idempotency::Idempotent, true)
    );
    let (svc, log) = recording(&[(10_000, 200), (0, 200)]);
    policy.layer(svc).oneshot(post).await.unwrap();
    assert_eq!(calls(&log), 1);
}

/// Unscoped trust yields to a marker or route that calls a PUT/DELETE a write: with a key,
/// such a request is neither retried after a 503 nor hedged. 1 call each.
///
/// Found by the review of 2026-12-04.
#[tokio::test(start_paused = true)]
async fn keyed_put_and_delete_called_writes_are_not_resent() {
    let policy = hedging()
        .honor_idempotency_key(true)
        .route(Method::PUT, "/v1/counters/{id}", Idempotency::NonIdempotent)
        .build()
        .unwrap();
    let put = keyed(Method::PUT, "http://api.test/v1/counters/7");
    assert!(!policy.classify(&put).is_keyed());
    let (svc, log) = recording(&[(1_000, 503), (0, 200)]);
    let res = policy.clone().layer(svc).oneshot(put).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(calls(&log), 1);

    let mut delete = keyed(Method::DELETE, "http://api.test/v1/queue/head");
    delete.extensions_mut().insert(Idempotency::NonIdempotent);
    assert!(!policy.classify(&delete).is_keyed());
    let (svc, log) = recording(&[(1_000, 503), (0, 200)]);
    let res = policy.layer(svc).oneshot(delete).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(calls(&log), 1);
}

/// A PUT a route calls a write, keyed, its host trusted: retried after a 503 (the key makes it
/// safe) but never hedged (not idempotent of itself, `keyed_writes` off): 2 calls, the second
/// after the first answered and the backoff (1100 ms), not at the hedge delay.
///
/// Found by the review of 2026-12-04.
#[tokio::test(start_paused = true)]
async fn a_keyed_put_called_a_write_on_a_trusted_host_is_retried_not_hedged() {
    let policy = hedging()
        .honor_idempotency_key_for_host("api.test")
        .route(Method::PUT, "/v1/counters/{id}", Idempotency::NonIdempotent)
        .build()
        .unwrap();
    let put = keyed(Method::PUT, "http://api.test/v1/counters/7");
    assert!(policy.classify(&put).is_keyed());
    let (svc, log) = recording(&[(1_000, 503), (0, 200)]);
    let res = policy.layer(svc).oneshot(put).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let seen = log.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].at, Duration::from_millis(1_100));
}

/// A keyed GET to a host whose keys are not trusted (trust is for another host) is not keyed:
/// a 409 is final (1 call). To the trusted host, the 409 (still in flight) is retried: 2 calls.
///
/// Found by the review of 2026-12-04.
#[tokio::test(start_paused = true)]
async fn a_keyed_get_to_an_untrusted_host_does_not_retry_409() {
    let policy = base()
        .honor_idempotency_key_for_host("b.test")
        .build()
        .unwrap();
    let a = keyed(Method::GET, "http://a.test/v1/things/1");
    assert!(!policy.classify(&a).is_keyed());
    let (svc, log) = recording(&[(0, 409), (0, 200)]);
    let res = policy.clone().layer(svc).oneshot(a).await.unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(calls(&log), 1);

    let b = keyed(Method::GET, "http://b.test/v1/things/1");
    assert!(policy.classify(&b).is_keyed());
    let (svc, log) = recording(&[(0, 409), (0, 200)]);
    let res = policy.layer(svc).oneshot(b).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(calls(&log), 2);
}
