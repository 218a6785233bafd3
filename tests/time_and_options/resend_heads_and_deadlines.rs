//! What every resend and hedge carries, and when the deadline ends them, against a recording
//! inner service on paused time: a retry's and a hedge's copy carry the first attempt's
//! method (an extension method), URI with query, version, multi-valued headers and
//! extensions; per-attempt headers are set, not accumulated; minted keys are copied once;
//! `Duration::MAX` and other huge deadlines, a zero deadline, the deadline absolute across
//! retries and body resumes, `grpc-timeout` with a policy deadline; a keyed read keeps its
//! method's verdict, a write by marker or route is never retried or hedged. From the review
//! of 2026-12-04.

use crate::support::trickle::Trickle;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_idempotency_keys::{IdempotencyLayer, MemoryStore};
use tower_retry_safety::{Hedge, Idempotency, RequestOptions, RetryPolicy, RetryPolicyBuilder};

// =======================================================================================
// Client side: a recording inner service (no server: the layer's own decisions), paused time
// =======================================================================================

/// A caller's extension, to see it on every attempt.
#[derive(Clone, Debug, PartialEq)]
struct Tag(&'static str);

#[derive(Debug)]
struct Seen {
    at: Duration,
    method: Method,
    uri: Uri,
    version: Version,
    headers: HeaderMap,
    tag: Option<Tag>,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// The n-th call (from 0) waits `plan[n].0` ms and answers status `plan[n].1` (the last one
/// repeats); a status of 1014 answers 200 with `grpc-status: 14`.
fn recording(
    plan: &'static [(u64, u16)],
) -> (
    impl tower::Service<
            Request<String>,
            Response = Response<String>,
            Error = Infallible,
            Future = impl Send,
        > + Clone,
    Log,
) {
    let log: Log = Arc::default();
    let seen = log.clone();
    let t0 = Instant::now();
    let svc = tower::service_fn(move |req: Request<String>| {
        let n = {
            let mut log = seen.lock().unwrap();
            log.push(Seen {
                at: t0.elapsed(),
                method: req.method().clone(),
                uri: req.uri().clone(),
                version: req.version(),
                headers: req.headers().clone(),
                tag: req.extensions().get::<Tag>().cloned(),
            });
            log.len() - 1
        };
        let (delay, status) = plan[n.min(plan.len() - 1)];
        async move {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            let mut res = Response::new(String::from("ok"));
            if status == 1014 {
                res.headers_mut()
                    .insert("content-type", HeaderValue::from_static("application/grpc"));
                res.headers_mut()
                    .insert("grpc-status", HeaderValue::from_static("14"));
            } else {
                *res.status_mut() = StatusCode::from_u16(status).unwrap();
            }
            Ok::<_, Infallible>(res)
        }
    });
    (svc, log)
}

fn base() -> RetryPolicyBuilder {
    RetryPolicy::builder()
        .jitter(false)
        .backoff(Duration::from_millis(100), Duration::from_secs(1))
        .max_retries(5)
        .no_budget()
        .attempt_header(Some(http::HeaderName::from_static("x-attempt")))
}

fn calls(log: &Log) -> usize {
    log.lock().unwrap().len()
}

fn without(headers: &HeaderMap, names: &[&str]) -> HeaderMap {
    let mut h = headers.clone();
    for n in names {
        h.remove(*n);
    }
    h
}

fn values(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

/// A WebDAV request with everything a copy could lose.
fn dav_request() -> Request<String> {
    let mut req = Request::builder()
        .method(Method::from_bytes(b"PROPFIND").unwrap())
        .uri("http://api.test/dav/a%20b/?depth=1&x=2&x=3")
        .version(Version::HTTP_2)
        .header("accept", "application/xml")
        .header("accept", "text/plain")
        .header("x-multi", "1")
        .header("x-multi", "2")
        .header("x-multi", "3")
        .header("depth", "1")
        .body(String::from("<propfind/>"))
        .unwrap();
    req.extensions_mut().insert(Tag("caller"));
    req.extensions_mut().insert(Idempotency::Idempotent);
    req
}

fn assert_same_head(seen: &[Seen], extra: &[&str]) {
    let first = &seen[0];
    let mut strip = vec!["x-attempt"];
    strip.extend_from_slice(extra);
    for (i, s) in seen.iter().enumerate() {
        assert_eq!(s.method.as_str(), "PROPFIND", "attempt {}", i + 1);
        assert_eq!(
            s.uri,
            "http://api.test/dav/a%20b/?depth=1&x=2&x=3",
            "attempt {}",
            i + 1
        );
        assert_eq!(s.version, Version::HTTP_2, "attempt {}", i + 1);
        assert_eq!(s.tag, Some(Tag("caller")), "attempt {}", i + 1);
        assert_eq!(
            without(&s.headers, &strip),
            without(&first.headers, &strip),
            "attempt {}",
            i + 1
        );
        assert_eq!(
            values(&s.headers, "accept"),
            ["application/xml", "text/plain"]
        );
        assert_eq!(values(&s.headers, "x-multi"), ["1", "2", "3"]);
        assert_eq!(
            values(&s.headers, "x-attempt"),
            [format!("{}", i + 1)],
            "attempt {}",
            i + 1
        );
    }
}

/// Retries of an extension method (marked idempotent) carry the first attempt's method, URI
/// with its query, HTTP/2, multi-valued headers and the caller's extension; the attempt header
/// is one value per attempt. Exactly 3 calls (503, 503, 200).
///
/// Found by the review of 2026-12-04.
#[tokio::test(start_paused = true)]
async fn retries_copy_the_whole_head_of_an_extension_method() {
    let (svc, log) = recording(&[(0, 503), (0, 503), (0, 200)]);
    let res = base()
        .build()
        .unwrap()
        .layer(svc)
        .oneshot(dav_request())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let seen = log.lock().unwrap();
    assert_eq!(seen.len(), 3);
    assert_same_head(&seen, &[]);
}

/// A hedge carries the same head as the attempt it hedges: 2 calls, the hedge 50 ms after.
///
/// Found by the review of 2026-12-04.
#[tokio::test(start_paused = true)]
async fn a_hedge_copies_the_whole_head_of_an_extension_method() {
    let (svc, log) = recording(&[(10_000, 200), (0, 200)]);
    let policy = base()
        .hedge(Hedge::fixed(Duration::from_millis(50)).max_extra_load(1.0))
        .build()
        .unwrap();
    let res = policy.layer(svc).oneshot(dav_request()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let seen = log.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].at, Duration::from_millis(50));
    assert_same_head(&seen, &[]);
}

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
    use tower_retry_safety::VerdictSource;
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
    use tower_retry_safety::ReadWholeLayer;
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
    let (bytes, err) = crate::support::read_whole::read_all(res.into_body()).await;
    let err = err.expect("the deadline ends the body");
    assert_eq!(t0.elapsed(), Duration::from_millis(1_000));
    let cut = crate::support::read_whole::find_cut(&*err).expect("a BodyCutError");
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

/// Minted keys go into the head every retry and hedge copies: a POST answered 503 then 200 is
/// sent twice with the one minted key (one value each); hedged (`keyed_writes`), its hedge
/// carries the same key. A DELETE a marker calls a write gets a key but unscoped trust yields
/// to the marker: a 503 is final, 1 call.
///
/// Found by the review of 2026-12-04.
#[tokio::test(start_paused = true)]
async fn minted_keys_are_copied_once_into_every_resend() {
    let policy = base().mint_idempotency_keys(true).build().unwrap();
    let (svc, log) = recording(&[(0, 503), (0, 200)]);
    let post = Request::post("http://api.test/v1/orders")
        .body(String::from("{}"))
        .unwrap();
    let res = policy.clone().layer(svc).oneshot(post).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    {
        let seen = log.lock().unwrap();
        assert_eq!(seen.len(), 2);
        let k0 = values(&seen[0].headers, "idempotency-key");
        assert_eq!(k0.len(), 1);
        assert_eq!(values(&seen[1].headers, "idempotency-key"), k0);
    }

    let hedged = base()
        .mint_idempotency_keys(true)
        .hedge(
            Hedge::fixed(Duration::from_millis(50))
                .max_extra_load(1.0)
                .keyed_writes(true),
        )
        .build()
        .unwrap();
    let (svc, log) = recording(&[(10_000, 200), (0, 200)]);
    let post = Request::post("http://api.test/v1/orders")
        .body(String::from("{}"))
        .unwrap();
    hedged.layer(svc).oneshot(post).await.unwrap();
    {
        let seen = log.lock().unwrap();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[1].at, Duration::from_millis(50));
        let k0 = values(&seen[0].headers, "idempotency-key");
        assert_eq!(k0.len(), 1);
        assert_eq!(values(&seen[1].headers, "idempotency-key"), k0);
    }

    let (svc, log) = recording(&[(0, 503), (0, 200)]);
    let mut delete = Request::delete("http://api.test/v1/queue/head")
        .body(String::new())
        .unwrap();
    delete.extensions_mut().insert(Idempotency::NonIdempotent);
    let res = policy.layer(svc).oneshot(delete).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    let seen = log.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(values(&seen[0].headers, "idempotency-key").len(), 1);
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A keyed PUT (source Method now, so hedged like an unkeyed PUT) against a real
/// IdempotencyLayer server whose handler takes 600 ms: the hedge meets the original in flight
/// (409, retried with backoff, never final while the original runs). The handler runs exactly
/// once and the caller gets the original's 200.
///
/// Found by the review of 2026-12-04.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedged_keyed_put_against_the_server_layer_runs_once() {
    let runs = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(AtomicUsize::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let layer = IdempotencyLayer::new(MemoryStore::new()).lease(Duration::from_secs(5));
    let counter = runs.clone();
    let svc = layer.layer(tower::service_fn(move |_req: Request<_>| {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(600)).await;
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"put"))))
        }
    }));
    let requests = seen.clone();
    let server = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (svc, requests) = (svc.clone(), requests.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    requests.fetch_add(1, Ordering::SeqCst);
                    tower::ServiceExt::oneshot(svc.clone(), req)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    let policy = RetryPolicy::builder()
        .jitter(false)
        .no_budget()
        .max_retries(5)
        .backoff(Duration::from_millis(100), Duration::from_millis(100))
        .honor_idempotency_key(true)
        .hedge(Hedge::fixed(Duration::from_millis(50)).max_extra_load(1.0))
        .build()
        .unwrap();
    let stack = policy.layer(client());
    let req = Request::put(format!("http://{addr}/v1/things/1"))
        .header("idempotency-key", "\"put-1204\"")
        .body(Full::new(Bytes::from_static(b"{\"v\":1}")))
        .unwrap();
    let res = stack.oneshot(req).await.unwrap();
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        (status, &body[..]),
        (StatusCode::OK, &b"put"[..]),
        "sent {}",
        seen.load(Ordering::SeqCst)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(seen.load(Ordering::SeqCst) >= 2, "the PUT was hedged");
    server.abort();
}
