//! The server's `IdempotencyLayer` in front of a real tonic server on loopback: the key is
//! the `idempotency-key` metadata, a stored response is answered again with its trailers (its
//! `grpc-status`), and the layer's own answers are gRPC statuses.

use std::time::Duration;

use retry_safety_testing::grpc::lab::ledger_client::LedgerClient;
use retry_safety_testing::grpc::lab::Entry;
use retry_safety_testing::grpc::{channel, request, serve_keyed, Fault};
use tonic::Code;
use tower::ServiceBuilder;
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};
use tower_retry_safety::{NoRetry, RetryPolicy, RetryPolicyBuilder};

fn builder() -> RetryPolicyBuilder {
    RetryPolicy::builder()
        .jitter(false)
        .backoff(Duration::from_millis(5), Duration::from_millis(20))
        .max_retries(2)
        .attempt_timeout(Duration::from_secs(1))
        .honor_idempotency_key(true)
}

async fn client(
    addr: std::net::SocketAddr,
    policy: RetryPolicy,
) -> LedgerClient<
    tower::util::MapErr<
        tower_retry_safety::RetrySafety<tonic::transport::Channel>,
        fn(tower_retry_safety::Error) -> tonic::Status,
    >,
> {
    let svc = ServiceBuilder::new()
        .map_err(tonic::Status::from as fn(_) -> _)
        .layer(policy)
        .service(channel(addr).await);
    LedgerClient::new(svc)
}

fn keyed(id: &str, key: &str, fault: Option<Fault>) -> tonic::Request<Entry> {
    let mut req = request(
        Entry {
            id: id.into(),
            payload: vec![1; 8],
        },
        id,
        fault,
    );
    req.metadata_mut()
        .insert("idempotency-key", key.parse().unwrap());
    req
}

/// Waits until the server has seen call `id`, then a little more for its key to be claimed
/// (the handler then sleeps 500 ms: the margin is wide).
async fn seen(lab: &retry_safety_testing::grpc::Lab, id: &str) {
    while lab.attempts(id).is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
}

#[tokio::test]
async fn a_keyed_write_lost_after_apply_gets_its_stored_response_with_its_grpc_status() {
    let (addr, lab) = serve_keyed(IdempotencyLayer::new(MemoryStore::new())).await;
    let mut client = client(addr, builder().build().unwrap()).await;
    for (i, fault) in [
        Fault::UnavailableAfterApply,
        Fault::ResetAfterApply,
        Fault::SlowAfterApply(Duration::from_secs(3)),
    ]
    .into_iter()
    .enumerate()
    {
        let id = format!("keyed-{i}");
        let res = client
            .append(keyed(&id, &format!("key-{i}"), Some(fault)))
            .await
            .unwrap_or_else(|s| panic!("{fault:?}: {s:?}"));
        // The second attempt got the stored answer: the first run's receipt, its OK status
        // from the trailers, and the stored-response header as metadata.
        assert_eq!(res.get_ref().applied, 1, "{fault:?}");
        assert_eq!(res.metadata().get("idempotent-replayed").unwrap(), "true");
        assert_eq!(lab.applied(&id), 1, "{fault:?}");
        assert_eq!(lab.attempts(&id).len(), 2, "{fault:?}");
    }
    assert_eq!(lab.applied_twice(), 0);
}

#[tokio::test]
async fn a_write_without_a_key_is_not_repeated_through_the_server_layer() {
    let (addr, lab) = serve_keyed(IdempotencyLayer::new(MemoryStore::new())).await;
    let mut client = client(addr, builder().build().unwrap()).await;
    let status = client
        .append(request(
            Entry {
                id: "bare".into(),
                payload: vec![],
            },
            "bare",
            Some(Fault::UnavailableAfterApply),
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(lab.applied("bare"), 1);
    assert_eq!(lab.attempts("bare").len(), 1);
}

#[tokio::test]
async fn the_layers_answers_are_grpc_statuses() {
    let (addr, lab) = serve_keyed(IdempotencyLayer::new(MemoryStore::new())).await;
    let once = builder()
        .max_retries(0)
        .attempt_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut first = client(addr, once.clone()).await;
    let mut second = client(addr, once).await;

    // In flight: the first call's handler takes 500 ms; the second gets ABORTED with a
    // pushback, and nothing runs twice.
    let mut slow = keyed("slow", "k-slow", None);
    slow.metadata_mut()
        .insert("x-delay-ms", "500".parse().unwrap());
    let running = tokio::spawn(async move { first.append(slow).await });
    seen(&lab, "slow").await;
    let mut again = keyed("slow", "k-slow", None);
    again.extensions_mut().insert(NoRetry);
    let status = second.append(again).await.unwrap_err();
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_eq!(
        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "1000"
    );
    running.await.unwrap().unwrap();
    assert_eq!(lab.applied("slow"), 1);

    // The key again with another call: INVALID_ARGUMENT.
    let status = second
        .append(keyed("other", "k-slow", None))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("different call"), "{status:?}");
    assert_eq!(lab.applied("other"), 0);

    // A malformed key: INVALID_ARGUMENT, nothing runs.
    let status = second
        .append(keyed("bad", "\"unterminated", None))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(lab.applied("bad"), 0);
}

#[tokio::test]
async fn our_client_waits_out_an_in_flight_key_and_gets_the_stored_response() {
    let (addr, lab) = serve_keyed(IdempotencyLayer::new(MemoryStore::new())).await;
    let patient = || {
        builder()
            .attempt_timeout(Duration::from_secs(5))
            .build()
            .unwrap()
    };
    let mut first = client(addr, patient()).await;
    let mut second = client(addr, patient()).await;
    let mut slow = keyed("wait", "k-wait", None);
    slow.metadata_mut()
        .insert("x-delay-ms", "500".parse().unwrap());
    let running = tokio::spawn(async move { first.append(slow).await });
    seen(&lab, "wait").await;
    // ABORTED with a pushback of 1 s, then the stored response of the first call's answer.
    let policy_wait = second.append(keyed("wait", "k-wait", None)).await.unwrap();
    assert_eq!(policy_wait.get_ref().applied, 1);
    assert_eq!(
        policy_wait.metadata().get("idempotent-replayed").unwrap(),
        "true"
    );
    running.await.unwrap().unwrap();
    assert_eq!(lab.applied("wait"), 1);
    assert_eq!(lab.attempts("wait").len(), 3);
}

/// Atomic mode (PostgreSQL): the same stored response with its trailers (the record of kind `T` in
/// the database), and the layer's answers as gRPC statuses.

#[tokio::test]
async fn atomic_mode_answers_a_repeat_with_the_stored_trailers() {
    use tower_idempotency_keys::stores::PostgresStore;
    let db = retry_safety_testing::pg::TestDb::new().await;
    let store = PostgresStore::from_pool(db.pool(4).await);
    store.migrate().await.unwrap();
    let (addr, lab) = serve_keyed(IdempotencyLayer::new(store).atomic()).await;
    let mut client = client(addr, builder().build().unwrap()).await;
    let res = client
        .append(keyed(
            "atomic",
            "k-atomic",
            Some(Fault::UnavailableAfterApply),
        ))
        .await
        .unwrap();
    assert_eq!(res.get_ref().applied, 1);
    assert_eq!(res.metadata().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(lab.applied("atomic"), 1);
    assert_eq!(lab.attempts("atomic").len(), 2);
    let status = client
        .append(keyed("other-call", "k-atomic", None))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(lab.applied("other-call"), 0);
}
