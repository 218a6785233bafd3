use std::time::Duration;

use http::{HeaderMap, HeaderValue, StatusCode};

use super::*;
use crate::classify::{Idempotency, VerdictSource};
use crate::policy::RetryPolicy;

const WRITE: RequestVerdict =
    RequestVerdict::new(Idempotency::NonIdempotent, VerdictSource::Method);
const READ: RequestVerdict = RequestVerdict::new(Idempotency::Idempotent, VerdictSource::Route);

fn trailers_only(status: &str, extra: &[(&'static str, &str)]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(GRPC_STATUS, HeaderValue::from_str(status).unwrap());
    for (name, value) in extra {
        headers.insert(*name, HeaderValue::from_str(value).unwrap());
    }
    headers
}

fn class_of(verdict: &RequestVerdict, headers: &HeaderMap) -> Classification {
    let policy = RetryPolicy::builder().build().unwrap();
    policy.classify_status(verdict, StatusCode::OK, headers, None, true)
}

#[test]
fn each_code_has_its_documented_class() {
    let retryable = [4, 8, 14];
    for code in 0..=16u32 {
        let headers = trailers_only(&code.to_string(), &[]);
        let expected = if retryable.contains(&code) {
            FailureClass::RetryableResponse
        } else {
            FailureClass::Final
        };
        assert_eq!(class_of(&READ, &headers).class(), expected, "code {code}");
    }
}

#[test]
fn aborted_is_retryable_on_a_key_or_with_pushback_only() {
    let aborted = trailers_only("10", &[]);
    assert_eq!(class_of(&READ, &aborted).class(), FailureClass::Final);
    let keyed = WRITE.with_key_trust(true).with_key(true);
    assert!(keyed.is_keyed());
    assert_eq!(
        class_of(&keyed, &aborted).class(),
        FailureClass::RetryableResponse
    );
    let pushed = trailers_only("10", &[("grpc-retry-pushback-ms", "20")]);
    let c = class_of(&READ, &pushed);
    assert_eq!(c.class(), FailureClass::RetryableResponse);
    assert_eq!(c.retry_after(), Some(Duration::from_millis(20)));
}

#[test]
fn headers_without_a_status_commit_the_call() {
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc+proto"),
    );
    assert!(is_grpc(&headers));
    assert_eq!(class_of(&READ, &headers).class(), FailureClass::Final);
}

#[test]
fn unavailable_to_a_write_is_a_response_the_decision_suppresses() {
    let policy = RetryPolicy::builder().build().unwrap();
    let c = class_of(&WRITE, &trailers_only("14", &[]));
    assert_eq!(c.class(), FailureClass::RetryableResponse);
    assert_eq!(
        policy.decide(&WRITE, &c, 0, None),
        crate::policy::Decision::Stop(crate::policy::StopReason::SuppressedNotIdempotent)
    );
    assert!(matches!(
        policy.decide(&READ, &c, 0, None),
        crate::policy::Decision::Retry { .. }
    ));
}

#[test]
fn pushback_is_the_wait_and_negative_or_malformed_means_do_not_retry() {
    let c = class_of(
        &READ,
        &trailers_only("14", &[("grpc-retry-pushback-ms", "250")]),
    );
    assert_eq!(c.retry_after(), Some(Duration::from_millis(250)));
    for bad in ["-1", "abc", "", "1.5", "99999999999999999999999"] {
        let c = class_of(
            &READ,
            &trailers_only("14", &[("grpc-retry-pushback-ms", bad)]),
        );
        assert_eq!(c.class(), FailureClass::Final, "{bad:?}");
    }
    // Longer than the policy's cap: not retried, and said so.
    let c = class_of(
        &READ,
        &trailers_only("14", &[("grpc-retry-pushback-ms", "9000000")]),
    );
    assert!(c.is_retry_after_too_long());
}

#[test]
fn malformed_statuses_are_final_and_never_panic() {
    for bad in ["", "x", "1x", "-14", "1400", " 14", "١٤"] {
        let mut headers = trailers_only("0", &[]);
        match HeaderValue::from_bytes(bad.as_bytes()) {
            Ok(v) => headers.insert(GRPC_STATUS, v),
            Err(_) => continue,
        };
        assert_eq!(
            class_of(&READ, &headers).class(),
            FailureClass::Final,
            "{bad:?}"
        );
    }
    assert_eq!(status_code(&HeaderValue::from_static("014")), Some(14));
    assert_eq!(status_code(&HeaderValue::from_static("999")), Some(999));
    assert_eq!(
        class_of(&READ, &trailers_only("999", &[])).class(),
        FailureClass::Final
    );
}

#[test]
fn a_grpc_status_outside_a_grpc_response_is_not_read() {
    let mut headers = trailers_only("14", &[]);
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    assert_eq!(class_of(&READ, &headers).class(), FailureClass::Final);
}

#[test]
fn timeouts_round_trip_in_the_finest_unit_that_holds_them() {
    for (d, text) in [
        (Duration::from_nanos(5), "5n"),
        (Duration::from_millis(1500), "1500000u"),
        (Duration::from_secs(100), "100000m"),
        (Duration::from_secs(200_000), "200000S"),
        (Duration::from_secs(3600 * 100_000), "6000000M"),
        (Duration::MAX, "99999999H"),
    ] {
        let value = encode_timeout(d);
        assert_eq!(value, text, "{d:?}");
        let back = parse_timeout(&value).unwrap();
        assert!(back <= d, "{d:?}");
    }
    for bad in ["", "S", "10", "10x", "123456789S", "-1S", "1.5S"] {
        assert_eq!(
            parse_timeout(&HeaderValue::from_str(bad).unwrap()),
            None,
            "{bad:?}"
        );
    }
    assert_eq!(
        parse_timeout(&HeaderValue::from_static("99999999H")),
        Some(Duration::from_secs(99_999_999 * 3600))
    );
}

#[test]
fn retries_carry_the_attempts_before_them_and_the_time_left() {
    let mut headers = HeaderMap::new();
    mark_attempt(&mut headers, 1, None);
    assert!(headers.is_empty());
    mark_attempt(&mut headers, 3, Some(Duration::from_millis(40)));
    assert_eq!(headers[PREVIOUS_ATTEMPTS], "2");
    assert_eq!(headers[GRPC_TIMEOUT], "40000000n");
}

#[test]
fn names_are_proto_names() {
    assert!(is_name("Ledger") && is_name("_x1") && !is_name("1x") && !is_name(""));
    assert!(is_full_name("") && is_full_name("a.b_c.D") && !is_full_name("a..b"));
    assert!(!is_full_name("a/{b}"));
}

/// A metric names a call by `pkg.Service/Method` only when the path has that shape: any
/// POST with a gRPC content type is a call, and an arbitrary path is no bounded attribute.
/// Found by review.
#[test]
fn a_method_name_is_read_only_from_a_path_of_grpcs_shape() {
    assert_eq!(
        method_name("/lab.v1.Ledger/Append"),
        Some("lab.v1.Ledger/Append")
    );
    assert_eq!(method_name("/Ledger/Append"), Some("Ledger/Append"));
    for path in [
        "/",
        "/v1/users/42/orders",
        "/lab.v1.Ledger",
        "/a..b.C/D",
        "/x/y?z",
        "/s/m/extra",
    ] {
        assert_eq!(method_name(path), None, "{path}");
    }
}

/// A request is a call only as a POST with a gRPC content type, on both halves alike.
/// Found by review: the server read any method's content type.
#[test]
fn only_a_post_with_a_grpc_content_type_is_a_call() {
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    assert!(is_call(&http::Method::POST, &headers));
    assert!(!is_call(&http::Method::PUT, &headers));
    assert!(!is_call(&http::Method::GET, &headers));
    assert!(!is_call(&http::Method::POST, &HeaderMap::new()));
}
