//! Hedging end to end: hyper-util's client under the layer, against a real hyper server on
//! loopback with a heavy tail (one operation in twenty takes 50 ms after applying, the rest
//! 1 ms). The server counts what reached it and what it applied, per operation. (Keyed writes
//! hedged against the server's `IdempotencyLayer`: the end-to-end tests'
//! `hedging/keyed_hedges.rs`.)

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use retry_safety_testing::fault_server::FaultServer;
use retry_safety_testing::hedging_stacks::{
    client, heavy_tail_request as request, send_and_read as send,
};
use tower::Layer;
use tower_retry_safety::{Hedge, RetryPolicy};

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
