//! Hedging end to end: hyper-util's client under the layer, against a real hyper server on
//! loopback with a heavy tail (one operation in twenty takes 50 ms after applying, the rest
//! 1 ms). The server counts what reached it and what it applied, per operation.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use retry_safety_testing::fault_server::{Fault, FaultServer};
use tower::{Layer, Service, ServiceExt};
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};
use tower_retry_safety::{Hedge, RetryPolicy, RetryReport};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Operation `i`: slow (50 ms) when `i.is_multiple_of(20)`, else 1 ms, after applying.
fn request(server: &FaultServer, method: Method, op: &str, i: u32) -> Request<Full<Bytes>> {
    let delay = if i.is_multiple_of(20) { "50" } else { "1" };
    Request::builder()
        .method(method)
        .uri(server.url(op))
        .header("x-fault", Fault::None.name())
        .header("x-handler-delay-ms", delay)
        .body(Full::new(Bytes::from_static(b"{\"amount\":1}")))
        .unwrap()
}

/// Sends `req` and reads the body; the report, or `None` for a service without the layer.
async fn send<S, E>(svc: &mut S, req: Request<Full<Bytes>>) -> Option<RetryReport>
where
    S: Service<Request<Full<Bytes>>, Response = Response<hyper::body::Incoming>, Error = E>,
    E: std::fmt::Debug,
{
    let res = svc.ready().await.unwrap().call(req).await.unwrap();
    let report = RetryReport::of(&res).cloned();
    res.into_body().collect().await.unwrap();
    report
}

/// Never twice: under every hedge setting, each POST without a trusted key reaches the server
/// exactly once — while the same settings do hedge slow reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_post_without_a_trusted_key_is_sent_twice_under_any_setting() {
    let settings = [
        Hedge::fixed(Duration::from_millis(1)).max_extra_load(1.0),
        Hedge::fixed(Duration::from_millis(1))
            .max_extra_load(1.0)
            .keyed_writes(true)
            .max_hedges(10),
        Hedge::learned()
            .max_extra_load(1.0)
            .min_samples(1)
            .keyed_writes(true),
    ];
    for (s, hedge) in settings.into_iter().enumerate() {
        let server = FaultServer::start().await;
        let policy = RetryPolicy::builder()
            .hedge(hedge.clone())
            .max_retries(10)
            // Keys are trusted only for another host: these POSTs' keys are not.
            .honor_idempotency_key_for_host("elsewhere.example")
            .no_budget()
            .build()
            .unwrap();
        let mut svc = policy.layer(client());
        let mut read_hedges = 0;
        // Slow: r0 (before the learned delay has a sample), r20 and r40.
        for i in 0..60 {
            let report = send(&mut svc, request(&server, Method::GET, &format!("r{i}"), i)).await;
            read_hedges += report.unwrap().hedges();
        }
        assert!(
            read_hedges >= 2,
            "setting {s}: the slow reads were hedged ({read_hedges})"
        );
        for i in 0..100 {
            let mut req = request(&server, Method::POST, &format!("w{i}"), i);
            if i.is_multiple_of(2) {
                req.headers_mut()
                    .insert("idempotency-key", format!("\"k-{s}-{i}\"").parse().unwrap());
            }
            let report = send(&mut svc, req).await.unwrap();
            assert_eq!(report.hedges(), 0, "setting {s}, op {i}");
        }
        for i in 0..100 {
            let stats = server.stats(&format!("w{i}"));
            assert_eq!(
                (stats.attempts, stats.applied),
                (1, 1),
                "setting {s} {hedge:?}, op {i}"
            );
        }
        assert_eq!(server.applied_twice(), 0);
    }
}

/// tower's `hedge` with a typical policy (clone every request, hedge at p80) on the same
/// workload applies slow writes twice; this crate's hedging, on the same server, never does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tower_hedge_applies_writes_twice_side_by_side() {
    #[derive(Clone)]
    struct CloneAll;
    impl tower::hedge::Policy<Request<Full<Bytes>>> for CloneAll {
        fn clone_request(&self, req: &Request<Full<Bytes>>) -> Option<Request<Full<Bytes>>> {
            let mut copy = Request::new(req.body().clone());
            *copy.method_mut() = req.method().clone();
            *copy.uri_mut() = req.uri().clone();
            *copy.headers_mut() = req.headers().clone();
            Some(copy)
        }
        fn can_retry(&self, _: &Request<Full<Bytes>>) -> bool {
            true
        }
    }
    const N: u32 = 200;
    let server = FaultServer::start().await;
    // Its histogram is read from the last period: pre-filled, as after a warm-up, so it
    // hedges from the first request.
    let warm = [1u64; 100];
    let mut tower_hedge = tower::hedge::Hedge::new_with_mock_latencies(
        client(),
        CloneAll,
        10,
        0.8,
        Duration::from_secs(30),
        &warm,
    );
    for i in 0..N {
        send(
            &mut tower_hedge,
            request(&server, Method::POST, &format!("t{i}"), i),
        )
        .await;
    }
    let tower_twice = server.applied_twice();
    let policy = RetryPolicy::builder()
        .hedge(Hedge::fixed(Duration::from_millis(2)).max_extra_load(1.0))
        .no_budget()
        .build()
        .unwrap();
    let mut ours = policy.layer(client());
    for i in 0..N {
        send(
            &mut ours,
            request(&server, Method::POST, &format!("o{i}"), i),
        )
        .await;
    }
    let ours_twice = (0..N)
        .filter(|i| server.applied(&format!("o{i}")) > 1)
        .count();
    let ours_sent: u32 = (0..N)
        .map(|i| server.stats(&format!("o{i}")).attempts)
        .sum();
    println!("POSTs applied twice of {N}: tower hedge {tower_twice}, this crate {ours_twice}");
    // Every slow one (1 in 20) at least: its hedge goes at ~1 ms, the write takes 50.
    assert!(
        tower_twice >= (N / 20) as usize,
        "tower's hedge: {tower_twice}"
    );
    assert_eq!(ours_twice, 0);
    assert_eq!(ours_sent, N);
}

/// Keyed writes, hedged by opt-in with the same key, against a server that honours keys:
/// the hedge of a slow write gets 409 (the first is still running), which is not fatal;
/// the first attempt's answer is returned, and every write is applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_writes_hedged_by_opt_in_are_applied_once() {
    const N: u32 = 100;
    let server = FaultServer::start_with_keys(IdempotencyLayer::new(MemoryStore::new())).await;
    let policy = RetryPolicy::builder()
        .honor_idempotency_key(true)
        .hedge(
            Hedge::fixed(Duration::from_millis(5))
                .max_extra_load(1.0)
                .keyed_writes(true),
        )
        .no_budget()
        .build()
        .unwrap();
    let mut svc = policy.layer(client());
    let mut hedged = 0;
    for i in 0..N {
        let mut req = request(&server, Method::POST, &format!("k{i}"), i);
        req.headers_mut()
            .insert("idempotency-key", format!("\"key-{i}\"").parse().unwrap());
        let report = send(&mut svc, req).await.unwrap();
        if i.is_multiple_of(20) {
            // Slow: hedged; the hedge's 409 waited out; the first attempt answered.
            assert_eq!((report.hedges(), report.won_by()), (1, Some(1)), "op {i}");
            let statuses: Vec<_> = report.attempt_outcomes().map(|a| a.status()).collect();
            assert_eq!(
                statuses,
                [Some(http::StatusCode::CONFLICT), Some(http::StatusCode::OK)],
                "op {i}"
            );
            assert_eq!(server.stats(&format!("k{i}")).attempts, 2, "op {i}");
        }
        hedged += report.hedges();
    }
    for i in 0..N {
        assert_eq!(server.applied(&format!("k{i}")), 1, "op {i}");
    }
    assert!(hedged >= N / 20, "{hedged}");
}
