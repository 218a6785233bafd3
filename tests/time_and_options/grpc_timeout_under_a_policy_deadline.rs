//! `grpc-timeout` with a policy deadline, against a recording inner service on paused time:
//! `grpc-timeout` and `grpc-previous-rpc-attempts` set per attempt against an absolute
//! deadline, the call's own timeout bounding a `Duration::MAX` policy deadline, and a huge
//! `grpc-timeout` that does not panic. From the review of 2026-12-04.

use retry_safety_testing::recording_service::{base, calls, recording, values};
use std::time::Duration;

use http::{Request, Version};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_retry_safety::Idempotency;

fn grpc_timeout(value: &str) -> Duration {
    let (digits, unit) = value.split_at(value.len() - 1);
    let n: u64 = digits.parse().unwrap();
    match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => panic!("unit {unit}"),
    }
}

fn grpc_request(timeout: Option<&'static str>) -> Request<String> {
    let mut b = Request::post("http://api.test/pkg.Svc/Read")
        .version(Version::HTTP_2)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("x-multi", "1")
        .header("x-multi", "2");
    if let Some(t) = timeout {
        b = b.header("grpc-timeout", t);
    }
    let mut req = b.body(String::new()).unwrap();
    req.extensions_mut().insert(Idempotency::Idempotent);
    req
}

/// A gRPC call with `grpc-timeout: 300m` and a policy deadline of 1 s: the deadline is 300 ms
/// from the first attempt, absolute: UNAVAILABLE at 100 ms, a retry at 150 ms carrying
/// `grpc-timeout` 150 ms and one `grpc-previous-rpc-attempts: 1`; the third would wait past
/// the deadline. Exactly 2 calls; one value of each per-attempt header.
///
/// Found by the review of 2026-12-04.
#[tokio::test(start_paused = true)]
async fn grpc_headers_are_set_per_attempt_against_an_absolute_deadline() {
    let (svc, log) = recording(&[(100, 1014)]);
    let policy = base()
        .backoff(Duration::from_millis(50), Duration::from_secs(1))
        .deadline(Duration::from_secs(1))
        .build()
        .unwrap();
    let res = policy
        .layer(svc)
        .oneshot(grpc_request(Some("300m")))
        .await
        .unwrap();
    assert_eq!(res.headers()["grpc-status"], "14");
    let seen = log.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].at, Duration::from_millis(150));
    for (i, s) in seen.iter().enumerate() {
        assert_eq!(
            values(&s.headers, "grpc-timeout").len(),
            1,
            "attempt {}",
            i + 1
        );
        assert_eq!(values(&s.headers, "x-attempt"), [format!("{}", i + 1)]);
        assert_eq!(values(&s.headers, "x-multi"), ["1", "2"]);
        assert_eq!(s.version, Version::HTTP_2);
        assert_eq!(s.uri, "http://api.test/pkg.Svc/Read");
    }
    assert_eq!(
        grpc_timeout(&values(&seen[0].headers, "grpc-timeout")[0]),
        Duration::from_millis(300)
    );
    assert_eq!(
        grpc_timeout(&values(&seen[1].headers, "grpc-timeout")[0]),
        Duration::from_millis(150)
    );
    assert!(seen[0].headers.get("grpc-previous-rpc-attempts").is_none());
    assert_eq!(
        values(&seen[1].headers, "grpc-previous-rpc-attempts"),
        ["1"]
    );
}

/// `grpc-timeout: 300m` with a policy deadline of `Duration::MAX`: the call's own timeout
/// bounds it (cut at exactly 300 ms, 1 call, an error), no panic.
///
/// Found by the review of 2026-12-04.
#[tokio::test(start_paused = true)]
async fn grpc_timeout_bounds_a_call_whose_policy_deadline_is_duration_max() {
    let (svc, log) = recording(&[(10_000, 200)]);
    let policy = base().deadline(Duration::MAX).build().unwrap();
    let start = Instant::now();
    let err = policy
        .layer(svc)
        .oneshot(grpc_request(Some("300m")))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    assert_eq!(calls(&log), 1);
    drop(err);
}

/// A huge `grpc-timeout` (99999999 hours, ~11,400 years: still a time) under a `Duration::MAX`
/// policy deadline: no panic; each attempt carries one `grpc-timeout` no larger than the
/// caller's; 3 calls (UNAVAILABLE twice, then 200).
///
/// Found by the review of 2026-12-04.
#[tokio::test(start_paused = true)]
async fn a_huge_grpc_timeout_with_a_duration_max_deadline_does_not_panic() {
    let (svc, log) = recording(&[(0, 1014), (0, 1014), (0, 200)]);
    let policy = base().deadline(Duration::MAX).build().unwrap();
    let res = policy
        .layer(svc)
        .oneshot(grpc_request(Some("99999999H")))
        .await
        .unwrap();
    assert!(res.headers().get("grpc-status").is_none());
    let seen = log.lock().unwrap();
    assert_eq!(seen.len(), 3);
    for s in seen.iter() {
        let t = values(&s.headers, "grpc-timeout");
        assert_eq!(t.len(), 1);
        assert!(grpc_timeout(&t[0]) <= Duration::from_secs(99_999_999 * 3600));
    }
}
