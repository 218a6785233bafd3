//! When the deadline ends the resends, against a recording inner service on paused time:
//! `Duration::MAX` and other huge deadlines, a zero deadline, the deadline absolute across
//! retries and across body resumes. From the review of 2026-12-04.

use retry_safety_testing::recording_service::{base, calls, recording};
use retry_safety_testing::trickle::Trickle;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_retry_safety::{RequestOptions, RetryPolicy};

// ---------------------------------------------------------------------------------------
// 4. deadline_at
// ---------------------------------------------------------------------------------------

fn slow_post() -> Request<String> {
    Request::put("http://api.test/v1/things/1")
        .body(String::from("{}"))
        .unwrap()
}

/// `deadline(Duration::MAX)` in the policy is no deadline: a 100 s attempt is not cut, and
/// 503, 503, 200 is retried to the 200. No panic anywhere.
///
/// Found by the review of 2026-12-04.
#[tokio::test(start_paused = true)]
async fn a_duration_max_policy_deadline_is_no_deadline() {
    let policy = base().deadline(Duration::MAX).build().unwrap();
    let (svc, log) = recording(&[(100_000, 200)]);
    let start = Instant::now();
    let res = policy
        .clone()
        .layer(svc)
        .oneshot(slow_post())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_secs(100));
    assert_eq!(calls(&log), 1);

    let (svc, log) = recording(&[(0, 503), (0, 503), (0, 200)]);
    let res = policy.layer(svc).oneshot(slow_post()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(calls(&log), 3);
}

/// Per-request `deadline(Duration::MAX)` and `attempt_timeout(Duration::MAX)` override a policy
/// deadline of 1 s: a 5 s attempt is not cut (1 call, 200).
///
/// Found by the review of 2026-12-04.
#[tokio::test(start_paused = true)]
async fn a_duration_max_request_deadline_overrides_the_policy_one() {
    let policy = base().deadline(Duration::from_secs(1)).build().unwrap();
    let (svc, log) = recording(&[(5_000, 200)]);
    let mut req = slow_post();
    req.extensions_mut().insert(
        RequestOptions::new()
            .deadline(Duration::MAX)
            .attempt_timeout(Duration::MAX),
    );
    let start = Instant::now();
    let res = policy.layer(svc).oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert_eq!(calls(&log), 1);
}

/// A deadline huge but still a time (u64::MAX / 4 seconds, addable to now): no panic, the
/// retries run (3 calls), a slow attempt is not cut.
///
/// Found by the review of 2026-12-04.
#[tokio::test(start_paused = true)]
async fn a_huge_but_addable_deadline_does_not_panic() {
    let huge = Duration::from_secs(u64::MAX / 4);
    let policy = base().deadline(huge).attempt_timeout(huge).build().unwrap();
    let (svc, log) = recording(&[(0, 503), (2_000, 503), (0, 200)]);
    let start = Instant::now();
    let res = policy.layer(svc).oneshot(slow_post()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(calls(&log), 3);
    // 2 s of attempt and backoffs of 100 and 200 ms.
    assert_eq!(start.elapsed(), Duration::from_millis(2_300));
}

/// A zero deadline: refused by the builder (`deadline`), and per request (where nothing refuses
/// it) the first attempt is sent (1 call), a slow one is cut at once with an error, and a 503
/// is not retried (1 call).
///
/// Found by the review of 2026-12-04.
#[tokio::test(start_paused = true)]
async fn a_zero_deadline_sends_once_and_never_retries() {
    let err = base().deadline(Duration::ZERO).build().unwrap_err();
    assert_eq!(err.setting_name(), "deadline");
    let policy = base().build().unwrap();
    let zero = || RequestOptions::new().deadline(Duration::ZERO);
    let (svc, log) = recording(&[(1_000, 200)]);
    let mut req = slow_post();
    req.extensions_mut().insert(zero());
    let start = Instant::now();
    assert!(policy.clone().layer(svc).oneshot(req).await.is_err());
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(calls(&log), 1);

    let (svc, log) = recording(&[(0, 503), (0, 200)]);
    let mut req = slow_post();
    req.extensions_mut().insert(zero());
    let res = policy.layer(svc).oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(calls(&log), 1);
}

/// The deadline is absolute from the first attempt across retries: 1 s, attempts of 300 ms
/// answering 503, backoff 100 ms: attempts at 0, 400 and 800 ms, the third cut at exactly
/// 1000 ms. 3 calls, an error.
///
/// Found by the review of 2026-12-04.
#[tokio::test(start_paused = true)]
async fn the_deadline_is_absolute_across_retries() {
    let policy = base()
        .backoff(Duration::from_millis(100), Duration::from_millis(100))
        .deadline(Duration::from_secs(1))
        .build()
        .unwrap();
    let (svc, log) = recording(&[(300, 503)]);
    let start = Instant::now();
    assert!(policy.layer(svc).oneshot(slow_post()).await.is_err());
    assert_eq!(start.elapsed(), Duration::from_millis(1_000));
    let seen = log.lock().unwrap();
    let at: Vec<_> = seen.iter().map(|s| s.at).collect();
    assert_eq!(
        at,
        [
            Duration::ZERO,
            Duration::from_millis(400),
            Duration::from_millis(800)
        ]
    );
}

// ---------------------------------------------------------------------------------------
// 4. deadline_at across body resumes (ReadWholeLayer under the retry layer), paused time
// ---------------------------------------------------------------------------------------

/// A GET whose body is cut every 300 ms, resumed with `Range` (a strong ETag), under a 1 s
/// deadline and 100 ms backoff: the deadline stays absolute over the resumes. The body ends
/// in an error at exactly 1000 ms, said to be the deadline's; 3 sends (bytes 0-, 30-, 60-).
///
/// Found by the review of 2026-12-04.
#[tokio::test(start_paused = true)]
async fn the_deadline_is_absolute_across_body_resumes() {
    use tower_retry_safety::resume::ReadWholeLayer;
    /// When each send came, and its `Range`.
    type Sends = Arc<Mutex<Vec<(Duration, Option<String>)>>>;
    let ranges: Sends = Arc::default();
    let seen = ranges.clone();
    let t0 = Instant::now();
    let svc = tower::service_fn(move |req: Request<String>| {
        let range = req
            .headers()
            .get("range")
            .map(|v| v.to_str().unwrap().to_owned());
        seen.lock().unwrap().push((t0.elapsed(), range.clone()));
        let from: usize = range
            .as_deref()
            .and_then(|r| r.strip_prefix("bytes="))
            .and_then(|r| r.strip_suffix('-'))
            .map_or(0, |n| n.parse().unwrap());
        async move {
            let body = Trickle {
                next: from,
                left: 3,
                sleep: Box::pin(tokio::time::sleep(Duration::from_millis(100))),
            };
            let mut res = Response::new(body);
            let h = res.headers_mut();
            h.insert("etag", HeaderValue::from_static("\"v1\""));
            h.insert("accept-ranges", HeaderValue::from_static("bytes"));
            h.insert("content-length", HeaderValue::from(100 - from));
            if from > 0 {
                h.insert(
                    "content-range",
                    HeaderValue::from_str(&format!("bytes {from}-99/100")).unwrap(),
                );
                *res.status_mut() = StatusCode::PARTIAL_CONTENT;
            }
            Ok::<_, Infallible>(res)
        }
    });
    let policy = RetryPolicy::builder()
        .jitter(false)
        .max_retries(100)
        .backoff(Duration::from_millis(100), Duration::from_millis(100))
        .no_budget()
        .deadline(Duration::from_secs(1))
        .build()
        .unwrap();
    let stack = policy.layer(ReadWholeLayer::new().limit(10).layer(svc));
    let res = stack
        .oneshot(
            Request::get("http://api.test/files/f")
                .body(String::new())
                .unwrap(),
        )
        .await
        .unwrap();
    let (bytes, err) = retry_safety_testing::read_whole::read_all(res.into_body()).await;
    let err = err.expect("the deadline ends the body");
    assert_eq!(t0.elapsed(), Duration::from_millis(1_000));
    let cut = retry_safety_testing::read_whole::find_cut(&*err).expect("a BodyCutError");
    assert!(cut.is_deadline(), "{cut}");
    let expect: Vec<u8> = (0..bytes.len()).map(|i| i as u8).collect();
    assert_eq!(
        bytes, expect,
        "the bytes delivered are the representation's, in order"
    );
    let ranges = ranges.lock().unwrap();
    let froms: Vec<_> = ranges.iter().map(|(_, r)| r.clone()).collect();
    assert_eq!(
        froms,
        [
            None,
            Some("bytes=30-".to_owned()),
            Some("bytes=60-".to_owned())
        ],
        "{ranges:?}"
    );
}
