//! Retry amplification under a total outage: every attempt answers 503 for a simulated minute
//! of steady load (paused time). With the default budget (`LockFreeBudget`), and with tower's
//! `TpsBudget`, attempts per request stay at or below 1.25; a naive "3 retries" policy sends 4.

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tower::retry::{Policy, Retry};
use tower::{Layer, Service, ServiceExt};
use tower_retry_safety::RetryPolicy;

const RATE_PER_SEC: u64 = 500;
const SECONDS: u64 = 60;

/// Every call answers 503 and is counted.
#[derive(Clone)]
struct Outage(Arc<AtomicU64>);

impl Service<Request<String>> for Outage {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<String>) -> Self::Future {
        self.0.fetch_add(1, Ordering::Relaxed);
        let mut res = Response::new(String::new());
        *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        ready(Ok(res))
    }
}

/// The naive policy: retry any 5xx three times.
#[derive(Clone)]
struct ThreeRetries(u32);

impl Policy<Request<String>, Response<String>, Infallible> for ThreeRetries {
    type Future = std::pin::Pin<Box<tokio::time::Sleep>>;

    fn retry(
        &mut self,
        _: &mut Request<String>,
        result: &mut Result<Response<String>, Infallible>,
    ) -> Option<Self::Future> {
        let failed = result.as_ref().is_ok_and(|r| r.status().is_server_error());
        if !failed || self.0 == 0 {
            return None;
        }
        self.0 -= 1;
        Some(Box::pin(tokio::time::sleep(Duration::from_millis(500))))
    }

    fn clone_request(&mut self, req: &Request<String>) -> Option<Request<String>> {
        Some(Request::new(req.body().clone()))
    }
}

/// Sends `RATE_PER_SEC` requests a second for `SECONDS`, each through `svc`, and returns the
/// inner calls per request.
async fn steady_load<S>(svc: S, calls: Arc<AtomicU64>) -> f64
where
    S: Service<Request<String>> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: Send,
    S::Error: Send,
{
    let mut tasks = tokio::task::JoinSet::new();
    let per_tick = RATE_PER_SEC / 100;
    for _ in 0..SECONDS * 100 {
        for _ in 0..per_tick {
            let svc = svc.clone();
            tasks.spawn(async move {
                let _ = svc
                    .oneshot(
                        Request::get("http://h/v1/items")
                            .body(String::new())
                            .unwrap(),
                    )
                    .await;
            });
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    while tasks.join_next().await.is_some() {}
    calls.load(Ordering::Relaxed) as f64 / (RATE_PER_SEC * SECONDS) as f64
}

#[tokio::test(start_paused = true)]
async fn the_default_budget_caps_amplification() {
    let calls = Arc::new(AtomicU64::new(0));
    let layer = RetryPolicy::builder().build().unwrap();
    let ours = steady_load(layer.layer(Outage(calls.clone())), calls).await;

    // The same with tower's budget, the default before `LockFreeBudget`.
    let tps_calls = Arc::new(AtomicU64::new(0));
    let tps = RetryPolicy::builder()
        .tps_budget(Duration::from_secs(10), 10, 0.2)
        .build()
        .unwrap();
    let tps = steady_load(tps.layer(Outage(tps_calls.clone())), tps_calls).await;

    let naive_calls = Arc::new(AtomicU64::new(0));
    let naive = steady_load(
        Retry::new(ThreeRetries(3), Outage(naive_calls.clone())),
        naive_calls,
    )
    .await;

    println!(
        "amplification {ours:.3} (default budget); {tps:.3} with tower's TpsBudget; naive 3-retry policy {naive:.3}"
    );
    assert!(ours <= 1.25, "amplification {ours}");
    assert!(tps <= 1.25, "amplification {tps} with TpsBudget");
    assert!(ours > 1.0, "the budget allowed no retry at all: {ours}");
    assert_eq!(naive, 4.0);
}
