//! The deadline a reqwest attempt hands on is never longer than the client waits for it,
//! reqwest's own per-request timeout included (the middleware's docs: it "applies to each
//! attempt").
//!
//! Found by the adversarial review of issue 48.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Empty;
use hyper::body::Incoming;
use tower::service_fn;
use tower_retry_safety::deadline::TIMEOUT_HEADER;
use tower_retry_safety::{RetryPolicy, RetrySafetyMiddleware};

use retry_safety_testing::runtime_server::{accept, listener};

/// `RequestBuilder::timeout(300 ms)` under a policy whose deadline is 5 s: reqwest gives up
/// on each attempt after 300 ms, so the attempt must say at most 300. Found: `4999` —
/// `send_attempt` writes `attempt_wait()`, the policy's attempt timeout or deadline, and
/// never looks at `reqwest::Request::timeout()`, which the middleware can read: the next hop
/// works 4.7 s for a caller that stopped after 300 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reqwest_request_timeout_bounds_the_deadline_on_the_wire() {
    let (socket, addr) = listener();
    let seen: Arc<Mutex<Vec<Option<u64>>>> = Arc::default();
    let kept = seen.clone();
    tokio::spawn(accept(
        socket,
        service_fn(move |req: Request<Incoming>| {
            let ms = req
                .headers()
                .get(TIMEOUT_HEADER)
                .and_then(|v| v.to_str().ok()?.parse().ok());
            kept.lock().expect("seen").push(ms);
            async { Response::builder().body(Empty::<Bytes>::new()) }
        }),
    ));
    let policy = RetryPolicy::builder()
        .deadline(Duration::from_secs(5))
        .send_deadline_to(&addr.to_string())
        .build()
        .expect("policy");
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetrySafetyMiddleware::new(policy))
        .build();
    let res = client
        .get(format!("http://{addr}/ok"))
        .timeout(Duration::from_millis(300))
        .send()
        .await
        .expect("a response");
    assert_eq!(res.status(), 200);
    let seen = seen.lock().expect("seen").clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(
        seen[0].is_some_and(|ms| ms <= 300),
        "request-timeout-ms {:?} for an attempt reqwest gives up on after 300 ms",
        seen[0]
    );
}
