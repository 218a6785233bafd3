//! The `on_attempt` hook as a metrics source: its counts equal what the fault server saw.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use retry_safety_testing::fault_server::{Fault, FaultServer};
use tower::{ServiceBuilder, ServiceExt};
use tower_retry_safety::policy::Decision;
use tower_retry_safety::{FailureClass, RetryPolicy, StopReason};

const OPS_PER_FAULT: usize = 5;

#[derive(Default, Debug)]
struct Counts {
    attempts: u32,
    retries: u32,
    retries_not_sent: u32,
    suppressed: u32,
    final_stops: u32,
}

#[tokio::test]
async fn attempt_events_count_what_the_server_saw() {
    let server = FaultServer::start().await;
    let counts = Arc::new(Mutex::new(Counts::default()));
    let seen = counts.clone();
    let policy = RetryPolicy::builder()
        .backoff(Duration::from_millis(5), Duration::from_millis(20))
        .no_budget()
        .on_attempt(move |e| {
            let mut c = seen.lock().unwrap();
            c.attempts += 1;
            match e.decision {
                Decision::Retry { .. } => {
                    c.retries += 1;
                    if e.class == FailureClass::NotSent {
                        c.retries_not_sent += 1;
                    }
                }
                Decision::Stop(StopReason::SuppressedNotIdempotent) => c.suppressed += 1,
                Decision::Stop(StopReason::Final) => c.final_stops += 1,
                _ => {}
            }
            assert!(!e.path.contains('?'));
        })
        .build()
        .unwrap();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let svc = ServiceBuilder::new()
        .layer(policy)
        .timeout(Duration::from_millis(400))
        .service(client);
    let mut tasks = tokio::task::JoinSet::new();
    for method in [Method::GET, Method::POST] {
        for fault in Fault::ALL {
            for i in 0..OPS_PER_FAULT {
                let op = format!("{method}-{}-{i}", fault.name());
                let req = Request::builder()
                    .method(method.clone())
                    .uri(format!("{}?secret=1", server.url(&op)))
                    .header("x-fault", fault.name())
                    .body(Full::new(Bytes::from_static(b"{}")))
                    .unwrap();
                let svc = svc.clone();
                tasks.spawn(async move { svc.oneshot(req).await.is_ok() });
            }
        }
    }
    while tasks.join_next().await.is_some() {}
    let ops = (2 * Fault::ALL.len() * OPS_PER_FAULT) as u32;
    let c = counts.lock().unwrap();
    assert_eq!(c.attempts, server.total_attempts(), "{c:?}");
    assert_eq!(c.retries, server.total_attempts() - ops, "{c:?}");
    assert_eq!(c.retries_not_sent, 0, "every attempt reached the server");
    // Every write whose first attempt met a fault is suppressed, once.
    let faulty_writes = ((Fault::ALL.len() - 1) * OPS_PER_FAULT) as u32;
    assert_eq!(c.suppressed, faulty_writes, "{c:?}");
    // Every read ends in a final 200; so do the writes without a fault.
    assert_eq!(c.final_stops, ops - faulty_writes, "{c:?}");
}
