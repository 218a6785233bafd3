//! `RetryPolicy::classify` allocates nothing for a rule scoped to an IPv4 host or for a
//! lenient path under 256 bytes. From the review of issue 19's fixes.

use crate::allocations;
use std::time::Duration;

use http::{Method, Request};
use tower_retry_safety::{Idempotency, RetryPolicy};

fn policy(
    build: impl FnOnce(tower_retry_safety::RetryPolicyBuilder) -> tower_retry_safety::RetryPolicyBuilder,
) -> RetryPolicy {
    build(
        RetryPolicy::builder()
            .max_retries(2)
            .backoff(Duration::from_millis(1), Duration::from_millis(5))
            .no_budget(),
    )
    .build()
    .unwrap()
}

/// `RetryPolicy::classify` "allocates nothing, but for a path over 256 bytes": with a rule
/// scoped to an IPv4 host, each request to that host allocates (`is_plain_name` compares
/// `ip.to_string()` with the host), though `canonical` returns it borrowed.
///
/// Found by the review of issue 19's fixes.
#[test]
fn classify_allocates_for_a_plain_ipv4_host() {
    let p = policy(|b| {
        b.route_for_host(
            "10.1.2.3",
            Method::PUT,
            "/v1/send/{id}",
            Idempotency::NonIdempotent,
        )
    });
    let req = Request::put("http://10.1.2.3:8080/v1/send/m1")
        .body(())
        .unwrap();
    let _ = p.classify(&req);
    let n = allocations(|| {
        std::hint::black_box(p.classify(&req));
    });
    assert_eq!(
        n, 0,
        "classify allocated {n} times for a canonical IPv4 host"
    );
}

/// The lenient spelling takes a scratch buffer of twice the path: a path of 129 to 256 bytes
/// with a `;` allocates, against the documented "allocates nothing, but for a path over 256
/// bytes".
///
/// Found by the review of issue 19's fixes.
#[test]
fn classify_allocates_for_a_lenient_path_under_256_bytes() {
    let p = policy(|b| b.route(Method::PUT, "/v1/send/{id}", Idempotency::NonIdempotent));
    let path = format!("/v1/other;v=1/{}", "a".repeat(150));
    assert!(path.len() < 256);
    let req = Request::put(format!("http://h{path}")).body(()).unwrap();
    let _ = p.classify(&req);
    let n = allocations(|| {
        std::hint::black_box(p.classify(&req));
    });
    assert_eq!(
        n,
        0,
        "classify allocated {n} times for a {}-byte path",
        path.len()
    );
}
