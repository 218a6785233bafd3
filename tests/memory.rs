//! 100,000 requests through the layer (routes, budget, retries, reports, errors) retain no
//! growing memory: live heap bytes are counted by a global allocator (a binary of its own).
//! `RETRY_SAFETY_SOAK=1` runs a million.

use std::future::{ready, Ready};
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use tower::{Layer, Service, ServiceExt};
use tower_retry_safety::{Idempotency, RetryPolicy};

use retry_safety_testing::alloc::{live_everywhere, Counting};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Every third call answers 503, every seventh fails: retries, reports and errors all happen.
#[derive(Clone)]
struct Mixed(&'static AtomicU64);

impl Service<Request<String>> for Mixed {
    type Response = Response<String>;
    type Error = std::io::Error;
    type Future = Ready<Result<Response<String>, std::io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), std::io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<String>) -> Self::Future {
        let n = self.0.fetch_add(1, Ordering::Relaxed);
        ready(match n % 21 {
            0 | 3 | 6 | 9 | 12 | 15 | 18 => {
                let mut res = Response::new(String::new());
                *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                Ok(res)
            }
            7 | 14 => Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
            _ => Ok(Response::new("ok".to_owned())),
        })
    }
}

static CALLS: AtomicU64 = AtomicU64::new(0);

fn request(i: u64) -> Request<String> {
    let method = if i.is_multiple_of(2) {
        Method::GET
    } else {
        Method::POST
    };
    Request::builder()
        .method(method)
        .uri(format!("http://h/v1/tools/t{}/execute?i={i}", i % 50))
        .header("x-request-id", format!("req-{i}"))
        .body("{}".to_owned())
        .unwrap()
}

#[test]
fn no_growing_memory_over_100_000_requests() {
    // 100,000 by default (a second or two); `RETRY_SAFETY_SOAK=1` for a million.
    let requests: u64 = retry_safety_testing::soak::soak(100_000, 1_000_000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let mut b = RetryPolicy::builder()
            .backoff(Duration::from_millis(1), Duration::from_millis(10))
            .mint_idempotency_keys(true);
        for r in 0..100 {
            b = b.route(
                Method::POST,
                &format!("/v1/r{r}/{{id}}"),
                Idempotency::Idempotent,
            );
        }
        let svc = b.build().unwrap().layer(Mixed(&CALLS));
        let run = |n: u64, start: u64| {
            let svc = svc.clone();
            async move {
                for i in start..start + n {
                    let _ = svc.clone().oneshot(request(i)).await;
                }
            }
        };
        run(5_000, 0).await; // warm up: budget slots, allocator caches
        let before = live_everywhere();
        run(requests, 5_000).await;
        let after = live_everywhere();
        let growth = after - before;
        println!(
            "memory: live heap {before} bytes before, {after} bytes after {requests} requests \
             (growth {growth} bytes, {} inner calls)",
            CALLS.load(Ordering::Relaxed)
        );
        assert!(growth.abs() < 16 * 1024, "live heap grew by {growth} bytes");
    });
}
