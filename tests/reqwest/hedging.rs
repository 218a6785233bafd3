//! Hedging through the reqwest-middleware adapter, against the loopback fault server: the
//! same decisions as the tower layer, counted on the server (a keyed write hedged against the
//! server's `IdempotencyLayer` is an end-to-end test, `reqwest/keyed_hedge.rs` in e2e/).
#![cfg(feature = "reqwest-middleware")]

use std::time::Duration;

use http::StatusCode;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use retry_safety_testing::fault_server::{Fault, FaultServer};
use tower_retry_safety::{Hedge, RetryPolicy, RetryReport, RetrySafetyMiddleware};

fn client(hedge: Hedge) -> ClientWithMiddleware {
    let policy = RetryPolicy::builder()
        .honor_idempotency_key_for_host("127.0.0.1")
        .hedge(hedge)
        .no_budget()
        .build()
        .unwrap();
    ClientBuilder::new(reqwest::Client::new())
        .with(RetrySafetyMiddleware::new(policy))
        .build()
}

fn fixed() -> Hedge {
    Hedge::fixed(Duration::from_millis(5)).max_extra_load(1.0)
}

/// The op's first attempt is held 800 ms after applying; the hedge answers at once and wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_read_is_hedged_and_the_hedge_wins() {
    let server = FaultServer::start().await;
    let res = client(fixed())
        .get(server.url("read"))
        .header("x-fault", Fault::SlowAfterApply.name())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let r = RetryReport::of_reqwest(&res).unwrap();
    assert_eq!((r.hedges(), r.won_by(), r.superseded()), (1, Some(2), 1));
    assert_eq!(server.stats("read").attempts, 2);
}

/// Never twice: the same slow first attempt of a POST without a key, or with a key the policy
/// does not trust for this host, is waited out, under every setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_without_a_trusted_key_is_never_hedged() {
    let server = FaultServer::start().await;
    let settings = [fixed(), fixed().keyed_writes(true).max_hedges(10)];
    for (s, hedge) in settings.into_iter().enumerate() {
        let c = client(hedge);
        let url = server
            .url(&format!("pay{s}"))
            .replace("127.0.0.1", "localhost");
        let res = c
            .post(url)
            .header("x-fault", Fault::SlowAfterApply.name())
            .header("idempotency-key", "\"untrusted-for-localhost\"")
            .body("{}")
            .send()
            .await
            .unwrap();
        let r = RetryReport::of_reqwest(&res).unwrap();
        assert_eq!(r.hedges(), 0, "setting {s}");
        let stats = server.stats(&format!("pay{s}"));
        assert_eq!((stats.attempts, stats.applied), (1, 1), "setting {s}");
        let res = c
            .post(server.url(&format!("nokey{s}")))
            .header("x-fault", Fault::SlowAfterApply.name())
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(RetryReport::of_reqwest(&res).unwrap().hedges(), 0);
        let stats = server.stats(&format!("nokey{s}"));
        assert_eq!((stats.attempts, stats.applied), (1, 1), "setting {s}");
    }
}
