//! Idempotency keys end to end: a client that mints keys, the shared fault server with
//! `IdempotencyLayer` behind the faults (responses dropped, delayed or replaced after the
//! handler ran), exactly-once writes counted on the server.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use retry_safety_testing::fault_server::{Fault, FaultServer};
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};
use tower_retry_safety::{RetryPolicy, RetryReport, StopReason};

// Well under the fault server's 800 ms slow response, well over a loaded machine's round trip.
const PER_ATTEMPT: Duration = Duration::from_millis(400);
const OPS_PER_FAULT: usize = 10;

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

fn policy() -> RetryPolicy {
    RetryPolicy::builder()
        .mint_idempotency_keys(true)
        .max_retries(4)
        .backoff(Duration::from_millis(10), Duration::from_millis(200))
        .no_budget()
        .build()
        .unwrap()
}

fn post(url: &str, fault: Fault, body: &'static str) -> Request<Full<Bytes>> {
    Request::post(url)
        .header("x-fault", fault.name())
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

#[tokio::test]
async fn every_write_applied_exactly_once_and_every_lost_response_recovered() {
    let server = FaultServer::start_with_keys(IdempotencyLayer::new(MemoryStore::new())).await;
    let svc = ServiceBuilder::new()
        .layer(policy())
        .timeout(PER_ATTEMPT)
        .service(client());

    let mut tasks = tokio::task::JoinSet::new();
    for fault in Fault::ALL {
        for i in 0..OPS_PER_FAULT {
            let op = format!("{}-{i}", fault.name());
            let svc = svc.clone();
            let url = server.url(&op);
            tasks.spawn(async move {
                let res = svc
                    .oneshot(post(&url, fault, "{\"to\":\"a@example.com\"}"))
                    .await;
                (op, fault, res)
            });
        }
    }
    let (mut writes, mut succeeded) = (0, 0);
    while let Some(done) = tasks.join_next().await {
        let (op, fault, res) = done.unwrap();
        writes += 1;
        let res = res.unwrap_or_else(|e| panic!("{op}: {e}"));
        assert_eq!(res.status(), StatusCode::OK, "{op}");
        let report = res.extensions().get::<RetryReport>().unwrap().clone();
        assert!(report.idempotency_key().is_some(), "{op}");
        let stored = res.headers().get("idempotent-replayed").is_some();
        // A lost, delayed or replaced response is recovered from the store, not re-run.
        let expect_stored = matches!(
            fault,
            Fault::DropAfterApply | Fault::SlowAfterApply | Fault::UnavailableAfterApply
        );
        assert_eq!(stored, expect_stored, "{op}");
        assert_eq!(
            report.attempts(),
            if fault == Fault::None { 1 } else { 2 },
            "{op}"
        );
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, format!("POST {op}").as_bytes(), "{op}: byte for byte");
        assert_eq!(server.applied(&op), 1, "{op}");
        succeeded += 1;
    }
    assert_eq!(server.applied_twice(), 0);
    assert_eq!(writes, OPS_PER_FAULT * Fault::ALL.len());
    assert_eq!(succeeded, writes);
    println!(
        "exactly once: {writes} writes, applied twice {}, succeeded {succeeded}",
        server.applied_twice()
    );
}

#[tokio::test]
async fn concurrent_duplicates_get_409_and_a_retrying_client_gets_the_stored_response() {
    let server = FaultServer::start_with_keys(IdempotencyLayer::new(MemoryStore::new())).await;
    let url = server.url("slow-write");
    let keyed = || {
        Request::post(&url)
            .header("idempotency-key", "\"dup-1\"")
            .header("x-handler-delay-ms", "300")
            .body(Full::new(Bytes::from_static(b"same")))
            .unwrap()
    };
    // Without retries: one runs, the other is told it is in flight.
    let (a, b) = tokio::join!(client().request(keyed()), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        client().request(keyed()).await
    });
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.status(), StatusCode::OK);
    assert_eq!(b.status(), StatusCode::CONFLICT);
    assert_eq!(b.headers()["retry-after"], "1");
    assert_eq!(server.applied("slow-write"), 1);

    // Through the layer, a 409 on a keyed request is retried until the stored response arrives.
    let url2 = server.url("slow-write-2");
    let keyed2 = |url: &str| {
        Request::post(url)
            .header("idempotency-key", "\"dup-2\"")
            .header("x-handler-delay-ms", "300")
            .body(Full::new(Bytes::from_static(b"same")))
            .unwrap()
    };
    let svc = ServiceBuilder::new()
        .layer(
            RetryPolicy::builder()
                .honor_idempotency_key(true)
                .max_retries(3)
                .no_budget()
                .build()
                .unwrap(),
        )
        .service(client());
    let (a, b) = tokio::join!(svc.clone().oneshot(keyed2(&url2)), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        svc.clone().oneshot(keyed2(&url2)).await
    });
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!((a.status(), b.status()), (StatusCode::OK, StatusCode::OK));
    assert_eq!(b.headers()["idempotent-replayed"], "true");
    let report = b.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.attempts(), 2);
    assert_eq!(
        report.attempt_outcomes().next().unwrap().status(),
        Some(StatusCode::CONFLICT)
    );
    assert_eq!(server.applied("slow-write-2"), 1);
}

#[tokio::test]
async fn a_payload_mismatch_gets_422_and_is_final() {
    let server = FaultServer::start_with_keys(IdempotencyLayer::new(MemoryStore::new())).await;
    let svc = ServiceBuilder::new().layer(policy()).service(client());
    let url = server.url("mismatch");
    let with = |body: &'static str| {
        Request::post(&url)
            .header("idempotency-key", "\"k-m\"")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    };
    assert_eq!(
        svc.clone().oneshot(with("one")).await.unwrap().status(),
        200
    );
    let res = svc.clone().oneshot(with("two")).await.unwrap();
    assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let report = res.extensions().get::<RetryReport>().unwrap();
    assert_eq!(
        (report.attempts(), report.stop_reason()),
        (1, StopReason::Final)
    );
    assert_eq!(server.applied("mismatch"), 1);
}

#[tokio::test]
async fn a_malformed_key_gets_400_and_never_reaches_the_store() {
    let server = FaultServer::start_with_keys(IdempotencyLayer::new(MemoryStore::new())).await;
    let long = format!("\"{}\"", "k".repeat(300));
    for bad in ["bare token", "\"\"", "\"open", "a\\b", long.as_str()] {
        let req = Request::builder()
            .method(Method::POST)
            .uri(server.url("malformed"))
            .header("idempotency-key", bad)
            .body(Full::new(Bytes::new()))
            .unwrap();
        let res = client().request(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{bad}");
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert!(String::from_utf8_lossy(&body).contains("malformed Idempotency-Key"));
    }
    assert_eq!(server.applied("malformed"), 0);
    assert!(server.keys().unwrap().store().is_empty());
}
