//! Keyed writes hedged by opt-in against the server's `IdempotencyLayer` over real sockets: the
//! hedge of a slow write gets 409 while the first runs and waits it out; every write is applied
//! once. From the adversarial review of safe hedging (issue 25), whose defect is fixed: hedges
//! kept firing after a keyed hedge's 409 (the core now holds hedging: `HedgeRun::held`); each
//! doc comment says what happened before ("Today:" is the review's word). The hedging tests
//! that need no server are the client's tests/hedging/.

use std::time::Duration;

use http::{Method, StatusCode};
use retry_safety_testing::fault_server::{Fault, FaultServer};
use retry_safety_testing::hedging_stacks::{
    client, heavy_tail_request as request, loopback_req, send, send_and_read,
};
use tower::Layer;
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};
use tower_retry_safety::{Hedge, RetryPolicy, RetryReport};

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
        let report = send_and_read(&mut svc, req).await.unwrap();
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

/// Keyed writes hedged by opt-in, through the crate's `IdempotencyLayer` (MemoryStore): the
/// hedge arrives while the first attempt runs (409, waited out); the first attempt then
/// applies and its connection drops without a response; the retry gets the stored answer.
/// Applied once, and the caller gets the first attempt's answer (the stored response).
///
/// Found by the adversarial review of safe hedging and the per-attempt spans (issue 25).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_hedge_409_then_a_first_attempt_lost_after_apply_is_applied_once() {
    let server = FaultServer::start_with_keys(IdempotencyLayer::new(MemoryStore::new())).await;
    let policy = RetryPolicy::builder()
        .honor_idempotency_key(true)
        .hedge(
            Hedge::fixed(Duration::from_millis(20))
                .max_extra_load(1.0)
                .keyed_writes(true),
        )
        .max_retries(3)
        .backoff(Duration::from_millis(5), Duration::from_millis(5))
        .no_budget()
        .build()
        .unwrap();
    let mut req = loopback_req(&server, Method::POST, "kb", 200);
    req.headers_mut()
        .insert("idempotency-key", "\"kb-1\"".parse().unwrap());
    req.headers_mut()
        .insert("x-fault", Fault::DropAfterApply.name().parse().unwrap());
    let (res, r) = send(&policy, req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.body().as_ref(), b"POST kb");
    assert!(r.is_stored_response(), "{r}");
    assert_eq!(server.applied("kb"), 1);
    assert_eq!(server.stats("kb").attempts, 3);
    let statuses: Vec<_> = r.attempt_outcomes().map(|a| a.status()).collect();
    assert_eq!(statuses[0], Some(StatusCode::CONFLICT), "{r}");
    assert_eq!(r.hedges(), 1);
}

/// A keyed hedge answered 409 says the first attempt is still running on the server: the
/// docs say "the attempts in flight are awaited". With `max_hedges(3)` the hedge timer keeps
/// firing after the 409, and every later hedge gets 409 too.
///
/// Today: the server sees 4 attempts (the first, then three hedges each answered 409) for a
/// write applied once; expected 2. Proposed fix: in `on_hedged_outcome`, when it answers
/// `KeepWaiting { resend_now: false }` because of a 409 or a Retry-After, also stop further
/// hedges for the request (e.g. set `HedgeRun.summary`'s remaining hedges to zero, or return a
/// flag that makes the front ends clear `timer`), in both front ends.
///
/// Found by the adversarial review of safe hedging and the per-attempt spans (issue 25).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_more_hedges_after_a_keyed_hedge_is_told_409() {
    let server = FaultServer::start_with_keys(IdempotencyLayer::new(MemoryStore::new())).await;
    let policy = RetryPolicy::builder()
        .honor_idempotency_key(true)
        .hedge(
            Hedge::fixed(Duration::from_millis(20))
                .max_extra_load(1.0)
                .max_hedges(3)
                .keyed_writes(true),
        )
        .max_retries(5)
        .no_budget()
        .build()
        .unwrap();
    // Three fast keyed writes save three hedge tokens.
    for i in 0..3 {
        let mut req = loopback_req(&server, Method::POST, &format!("warm{i}"), 0);
        req.headers_mut()
            .insert("idempotency-key", format!("\"w-{i}\"").parse().unwrap());
        send(&policy, req).await.unwrap();
    }
    let mut req = loopback_req(&server, Method::POST, "k409", 400);
    req.headers_mut()
        .insert("idempotency-key", "\"k409\"".parse().unwrap());
    let (res, r) = send(&policy, req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(server.applied("k409"), 1);
    assert_eq!((server.stats("k409").attempts, r.hedges()), (2, 1), "{r}");
}

/// The reqwest adapter after a keyed hedge's 409: the same defect as
/// `no_more_hedges_after_a_keyed_hedge_is_told_409` — `hedged::run` keeps its `timer` armed on
/// `KeepWaiting`, so with `max_hedges(3)` every later hedge gets 409 too.
///
/// Today: 4 sends (3 hedges), expected 2 (1 hedge). Proposed fix: as for the tower layer,
/// disarm `timer` when the core answers `KeepWaiting` for a 409 or a Retry-After.
///
/// Found by the adversarial review of safe hedging and the per-attempt spans (issue 25).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reqwest_no_more_hedges_after_a_409() {
    use tower_retry_safety::RetrySafetyMiddleware;
    let server = FaultServer::start_with_keys(IdempotencyLayer::new(MemoryStore::new())).await;
    let policy = RetryPolicy::builder()
        .honor_idempotency_key(true)
        .hedge(
            Hedge::fixed(Duration::from_millis(20))
                .max_extra_load(1.0)
                .max_hedges(3)
                .keyed_writes(true),
        )
        .max_retries(5)
        .no_budget()
        .build()
        .unwrap();
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetrySafetyMiddleware::new(policy))
        .build();
    for i in 0..3 {
        client
            .post(server.url(&format!("rw{i}")))
            .header("idempotency-key", format!("\"rw-{i}\""))
            .body("{}")
            .send()
            .await
            .unwrap();
    }
    let res = client
        .post(server.url("r409"))
        .header("idempotency-key", "\"r409\"")
        .header("x-handler-delay-ms", "400")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let r = RetryReport::of_reqwest(&res).unwrap().clone();
    assert_eq!(server.applied("r409"), 1);
    assert_eq!((server.stats("r409").attempts, r.hedges()), (2, 1), "{r}");
}
