//! A per-attempt timeout of `Duration::MAX` (policy or request options) with a body read
//! whole: a per-frame wait too long to be a time is no per-frame limit, not a panic. From the
//! review of 2026-12-04 (its three tests failed before the fix).

use retry_safety_testing::trickle::Trickle;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Request, Response};
use hyper_util::rt::TokioIo;
use tower::{Layer, ServiceExt};
use tower_retry_safety::{RequestOptions, RetryPolicy};

/// A body of 100 bytes in 10-byte chunks every 100 ms, through `ReadWholeLayer` with `limit`,
/// under a policy or request attempt timeout of `Duration::MAX`: the bytes and error read, and
/// the sends.
async fn read_whole_with_max_attempt_timeout(
    limit: u64,
    in_policy: bool,
) -> (usize, Option<String>, usize) {
    use tower_retry_safety::resume::ReadWholeLayer;
    let sends = Arc::new(AtomicUsize::new(0));
    let counter = sends.clone();
    let svc = tower::service_fn(move |_req: Request<String>| {
        counter.fetch_add(1, Ordering::SeqCst);
        async move {
            let body = Trickle {
                next: 0,
                left: 10,
                sleep: Box::pin(tokio::time::sleep(Duration::from_millis(100))),
            };
            let mut res = Response::new(body);
            res.headers_mut()
                .insert("content-length", HeaderValue::from(100));
            Ok::<_, Infallible>(res)
        }
    });
    let mut builder = RetryPolicy::builder().no_budget().deadline(Duration::MAX);
    if in_policy {
        builder = builder.attempt_timeout(Duration::MAX);
    }
    let policy = builder.build().unwrap();
    let mut req = Request::get("http://api.test/files/f")
        .body(String::new())
        .unwrap();
    if !in_policy {
        req.extensions_mut()
            .insert(RequestOptions::new().attempt_timeout(Duration::MAX));
    }
    let stack = policy.layer(ReadWholeLayer::new().limit(limit).layer(svc));
    let res = stack.oneshot(req).await.unwrap();
    let (bytes, err) = retry_safety_testing::read_whole::read_all(res.into_body()).await;
    (
        bytes.len(),
        err.map(|e| e.to_string()),
        sends.load(Ordering::SeqCst),
    )
}

/// FIXED (was an open defect). `Duration::MAX` as the per-attempt timeout in the policy
/// (`RetryPolicyBuilder::attempt_timeout`, which accepts it) with a GET whose body goes through
/// `ReadWholeLayer` (100 bytes in 10-byte chunks, read inside the attempt with the default
/// 64 KiB limit, or streamed past a 10-byte limit): the caller's first `poll_frame` panics
/// with "overflow when adding duration to instant" at `src/attempt_clock.rs:84`
/// (`FrameClock::end`: `Instant::now() + wait`, the per-attempt timeout being the per-frame
/// wait), from `WholeBody::poll_frame` (`src/resume/body.rs:191`). Both limits panic (0 of 100
/// bytes read). Expected: 100 bytes, no error, 1 send, as `deadline(Duration::MAX)` now
/// behaves (no deadline) and as the attempt's own timer behaves (tokio's `sleep` saturates).
/// The same `FrameClock` times resumed bodies (`src/resume/future.rs:132`) and the reqwest
/// adapter's `ReadWholeMiddleware` (`reqwest_read_whole_with_a_duration_max_attempt_timeout`). Proposed fix: a per-frame wait too long to be a time is no per-frame
/// limit: drop it in `FrameClock::new` (`frame_wait.filter(|w|
/// Instant::now().checked_add(*w).is_some())`, so a clock left with neither limit is `None`),
/// and saturate in `end` (`checked_add`, else a far-future instant). Not merely `.and_then`
/// in `end`: with no deadline `end` would then return `Instant::now()` and cut every body.
///
/// Found by the review of 2026-12-04.
#[tokio::test(start_paused = true)]
async fn a_duration_max_attempt_timeout_in_the_policy_with_a_read_whole_body() {
    assert_eq!(
        read_whole_with_max_attempt_timeout(64 * 1024, true).await,
        (100, None, 1)
    );
    assert_eq!(
        read_whole_with_max_attempt_timeout(10, true).await,
        (100, None, 1)
    );
}

/// FIXED (was an open defect). The same panic from a per-request
/// `RequestOptions::attempt_timeout(Duration::MAX)` (see
/// `a_duration_max_attempt_timeout_in_the_policy_with_a_read_whole_body`), with either limit:
/// "overflow when adding duration to instant" at `src/attempt_clock.rs:84`, in the caller's
/// body read (0 of 100 bytes). Expected 100 bytes, no error, 1 send. Same fix.
///
/// Found by the review of 2026-12-04.
#[tokio::test(start_paused = true)]
async fn a_duration_max_attempt_timeout_in_request_options_with_a_read_whole_body() {
    assert_eq!(
        read_whole_with_max_attempt_timeout(64 * 1024, false).await,
        (100, None, 1)
    );
    assert_eq!(
        read_whole_with_max_attempt_timeout(10, false).await,
        (100, None, 1)
    );
}

/// The reqwest adapter with `ReadWholeMiddleware` and `attempt_timeout(Duration::MAX)` in the
/// policy, against a loopback server that sends 100 bytes in 10-byte chunks: the body's bytes
/// and error, and the requests the server saw.
#[cfg(feature = "reqwest-middleware")]
async fn reqwest_read_whole_with_max_attempt_timeout() -> (usize, Option<String>, usize) {
    use tower_retry_safety::resume::ReadWholeMiddleware;
    use tower_retry_safety::RetrySafetyMiddleware;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let requests = seen.clone();
    let server = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let requests = requests.clone();
            tokio::spawn(async move {
                let svc =
                    hyper::service::service_fn(move |_req: Request<hyper::body::Incoming>| {
                        requests.fetch_add(1, Ordering::SeqCst);
                        async move {
                            let body = Trickle {
                                next: 0,
                                left: 10,
                                sleep: Box::pin(tokio::time::sleep(Duration::from_millis(20))),
                            };
                            let mut res = Response::new(body);
                            res.headers_mut()
                                .insert("content-length", HeaderValue::from(100));
                            Ok::<_, Infallible>(res)
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    // Real time here: the first chunk after 20 ms, the others 100 ms apart (~0.9 s in all).
    let policy = RetryPolicy::builder()
        .no_budget()
        .attempt_timeout(Duration::MAX)
        .build()
        .unwrap();
    let client = reqwest::Client::new();
    let client = reqwest_middleware::ClientBuilder::new(client.clone())
        .with(RetrySafetyMiddleware::new(policy))
        .with(ReadWholeMiddleware::new().resume_with(client))
        .build();
    let mut res = client
        .get(format!("http://{addr}/files/f"))
        .send()
        .await
        .unwrap();
    let mut bytes = 0;
    let mut err = None;
    loop {
        match res.chunk().await {
            Ok(Some(c)) => bytes += c.len(),
            Ok(None) => break,
            Err(e) => {
                err = Some(e.to_string());
                break;
            }
        }
    }
    server.abort();
    (bytes, err, seen.load(Ordering::SeqCst))
}

/// FIXED (was an open defect). The reqwest adapter has the same panic, earlier: `send().await` itself panics
/// with "overflow when adding duration to instant" at `src/attempt_clock.rs:84`
/// (`FrameClock::end`), from `resume::future::Reading::poll_stall` (`src/resume/future.rs:232`,
/// the body read inside the attempt by `ReadWholeMiddleware`). The server saw 1 request; the
/// caller got a panic instead of 100 bytes. Expected `(100, None, 1)`. Same fix as
/// `a_duration_max_attempt_timeout_in_the_policy_with_a_read_whole_body`.
///
/// Found by the review of 2026-12-04.
#[cfg(feature = "reqwest-middleware")]
#[tokio::test]
async fn reqwest_read_whole_with_a_duration_max_attempt_timeout() {
    assert_eq!(
        reqwest_read_whole_with_max_attempt_timeout().await,
        (100, None, 1)
    );
}
