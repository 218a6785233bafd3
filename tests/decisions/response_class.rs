//! Response classification: retry set, Retry-After, retry-after-ms, x-should-retry, the stored-response
//! mark (read only for a keyed request).

use std::time::Duration;

use http::{Response, StatusCode};
use tower_retry_safety::{FailureClass, RetryPolicy};

fn res(status: u16, headers: &[(&str, &str)]) -> Response<()> {
    let mut b = Response::builder().status(status);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(()).unwrap()
}

fn get_verdict(p: &RetryPolicy) -> tower_retry_safety::classify::RequestVerdict {
    p.classify(&http::Request::get("/v1/things").body(()).unwrap())
}

fn class(p: &RetryPolicy, status: u16, headers: &[(&str, &str)]) -> FailureClass {
    p.classify_response(&get_verdict(p), &res(status, headers))
        .class()
}

#[test]
fn default_retry_set() {
    let p = RetryPolicy::builder().build().unwrap();
    for s in [408, 429, 500, 502, 503, 504] {
        assert_eq!(class(&p, s, &[]), FailureClass::RetryableResponse, "{s}");
    }
    for s in [
        200, 201, 204, 301, 400, 401, 403, 404, 409, 422, 501, 505, 599,
    ] {
        assert_eq!(class(&p, s, &[]), FailureClass::Final, "{s}");
    }
}

#[test]
fn retry_set_is_configurable() {
    let p = RetryPolicy::builder()
        .retry_statuses([
            StatusCode::SERVICE_UNAVAILABLE,
            StatusCode::from_u16(599).unwrap(),
        ])
        .build()
        .unwrap();
    assert_eq!(class(&p, 599, &[]), FailureClass::RetryableResponse);
    assert_eq!(class(&p, 503, &[]), FailureClass::RetryableResponse);
    assert_eq!(class(&p, 500, &[]), FailureClass::Final);
}

#[test]
fn retry_after_seconds_and_millis() {
    let p = RetryPolicy::builder().build().unwrap();
    let c = p.classify_response(&get_verdict(&p), &res(429, &[("retry-after", "0")]));
    assert_eq!(c.retry_after(), Some(Duration::ZERO));
    let c = p.classify_response(
        &get_verdict(&p),
        &res(503, &[("retry-after", "2"), ("retry-after-ms", "150")]),
    );
    assert_eq!(c.retry_after(), Some(Duration::from_millis(150)));
    let c = p.classify_response(&get_verdict(&p), &res(503, &[("retry-after", "garbage")]));
    assert_eq!(c.class(), FailureClass::RetryableResponse);
    assert_eq!(c.retry_after(), None);
}

/// The class stays the status's (issue 41, item 6: a too-long wait used to make it final,
/// and so "may have been applied" for a status that proves nothing ran).
#[test]
fn retry_after_above_the_cap_is_not_retried_and_says_so() {
    let p = RetryPolicy::builder()
        .max_retry_after(Duration::from_secs(30))
        .build()
        .unwrap();
    let c = p.classify_response(&get_verdict(&p), &res(503, &[("retry-after", "31")]));
    assert_eq!(c.class(), FailureClass::RetryableResponse);
    assert!(c.is_retry_after_too_long());
    assert_eq!(c.retry_after(), Some(Duration::from_secs(31)));
    let c = p.classify_response(&get_verdict(&p), &res(503, &[("retry-after", "30")]));
    assert_eq!(c.class(), FailureClass::RetryableResponse);
    assert!(!c.is_retry_after_too_long());
    let c = p.classify_response(
        &get_verdict(&p),
        &res(429, &[("retry-after", "184467440737095516150")]),
    );
    assert!(c.is_retry_after_too_long());
}

#[test]
fn retry_after_on_a_final_status_is_ignored() {
    let p = RetryPolicy::builder().build().unwrap();
    let c = p.classify_response(&get_verdict(&p), &res(400, &[("retry-after", "5")]));
    assert_eq!(c.class(), FailureClass::Final);
    assert_eq!(c.retry_after(), None);
}

#[test]
fn server_hint() {
    let p = RetryPolicy::builder().build().unwrap();
    assert_eq!(
        class(&p, 503, &[("x-should-retry", "false")]),
        FailureClass::Final
    );
    assert_eq!(
        class(&p, 409, &[("x-should-retry", "true")]),
        FailureClass::RetryableResponse
    );
    // A success is never made retryable; an unknown hint value is ignored.
    assert_eq!(
        class(&p, 200, &[("x-should-retry", "true")]),
        FailureClass::Final
    );
    assert_eq!(
        class(&p, 503, &[("x-should-retry", "maybe")]),
        FailureClass::RetryableResponse
    );
}

#[test]
fn server_hint_header_is_settable_or_off() {
    let p = RetryPolicy::builder()
        .should_retry_header(Some("x-retry-hint".parse().unwrap()))
        .build()
        .unwrap();
    assert_eq!(
        class(&p, 503, &[("x-retry-hint", "false")]),
        FailureClass::Final
    );
    assert_eq!(
        class(&p, 503, &[("x-should-retry", "false")]),
        FailureClass::RetryableResponse
    );
    let p = RetryPolicy::builder()
        .should_retry_header(None)
        .build()
        .unwrap();
    assert_eq!(
        class(&p, 503, &[("x-should-retry", "false")]),
        FailureClass::RetryableResponse
    );
}

/// Only a request that carries a key can be answered with a stored response: the mark on a
/// response to one without a key is not read (its status decides), and a key the policy does
/// not trust is still a key the server may have stored for. (Moved here from the stored-response
/// tests, now end-to-end tests in e2e/: this one needs no server.)
#[test]
fn only_a_request_with_a_key_reads_the_stored_response_mark() {
    let policy = tower_retry_safety::RetryPolicy::builder().build().unwrap();
    let res = http::Response::builder()
        .status(503)
        .header("idempotent-replayed", "true")
        .body(())
        .unwrap();
    let get = http::Request::get("http://a.example/x").body(()).unwrap();
    let c = policy.classify_response(&policy.classify(&get), &res);
    assert!(!c.is_stored_response());
    assert_eq!(
        c.class(),
        tower_retry_safety::FailureClass::RetryableResponse
    );
    let keyed = http::Request::post("http://a.example/x")
        .header("idempotency-key", "\"k1\"")
        .body(())
        .unwrap();
    let c = policy.classify_response(&policy.classify(&keyed), &res);
    assert!(c.is_stored_response());
}
