//! Keys across a Redis failover, waiting for replicas: a claim and a stored response count as
//! written only once a replica has them (`WAIT`). A claim no replica confirmed is refused and
//! the key runs once after the failover; a response no replica confirmed is stored again on the
//! promoted replica. Each has a control (not waiting) that shows the scenario really loses the
//! key.

use std::time::Duration;

use super::{
    assert_refused_naming, fingerprint, ok_response, reader, replicated, send, wait_for, Answer,
    LIMIT,
};
use http::StatusCode;
use retry_safety_testing::fleet::{Counts, Fault, Instance};
use retry_safety_testing::redis::{Node, Proxy, PATIENT};
use tower_idempotency_keys::{
    stores::RedisStore, Begin, Entry, FencingToken, Fingerprint, IdempotencyStore, StoredResponse,
};

/// An instance on the primary at `url` whose store waits for `replicas` replicas. Patient: a
/// write its replica can confirm is confirmed, however busy the machine (the scenario's ground
/// truth is its answers: a confirmation that took over 300 ms, the old setting, on a busy CI
/// runner answered 503); one it cannot (the stream held back) is refused after the patient
/// wait, which the scenario does not test.
async fn instance_on_the_primary(url: String, replicas: u32, counts: &Counts) -> Instance {
    Instance::start_with(
        move || async move {
            RedisStore::builder(&url)
                .wait_for_replicas(replicas)
                .timeout(PATIENT)
                .replica_timeout(PATIENT)
                .connect()
                .await
        },
        "failover:",
        Duration::from_secs(5),
        counts.clone(),
    )
    .await
}

/// An instance on the promoted replica at `url`, whose store waits for no replica. The
/// promoted replica has no replica of its own: waiting for one is refused at connect, naming
/// the setting.
async fn instance_on_the_promoted_replica(url: String, counts: &Counts) -> Instance {
    let refused = RedisStore::builder(&url)
        .wait_for_replicas(1)
        .connect()
        .await
        .expect_err("no replica to wait for");
    assert_refused_naming(&refused, "wait_for_replicas(1)");

    Instance::start_with(
        move || async move {
            // Patient: this instance's answers are the test's ground truth, not its timeouts
            // (a busy machine can take over a second for a round trip).
            RedisStore::builder(&url)
                .wait_for_replicas(0)
                .timeout(PATIENT)
                .connect()
                .await
        },
        "failover:",
        Duration::from_secs(5),
        counts.clone(),
    )
    .await
}

/// The first request to a key reaches the primary while the replication stream is held back
/// (a proxy between primary and replica, paused); the primary is killed and its replica
/// promoted; the repeat goes to a second instance on the promoted replica. Returns how many
/// times the handler of that key ran, and the first request's answer.
async fn replica_behind(replicas: u32) -> (u32, Answer) {
    let mut primary = Node::primary();
    let proxy = Proxy::start(primary.port).await;
    let replica = Node::replica_of(proxy.port);
    replicated(&primary, &replica);
    let counts = Counts::default();
    let a = instance_on_the_primary(primary.url(), replicas, &counts).await;

    if replicas > 0 {
        // A key answered while the stream flows: confirmed on the replica before the answer,
        // it is the stored response read from the promoted replica below.
        let answer = send(a.addr, "confirmed", "k-confirmed", Fault::None).await;
        assert_eq!(answer.status, StatusCode::OK);
    }

    proxy.pause();
    let first = send(a.addr, "behind", "k-behind", Fault::None).await;
    primary.kill();
    replica.promote();

    let b = instance_on_the_promoted_replica(replica.url(), &counts).await;
    let again = send(b.addr, "behind", "k-behind", Fault::None).await;
    assert_eq!(
        again,
        Answer {
            status: StatusCode::OK,
            stored: false
        }
    );
    if replicas > 0 {
        let confirmed = send(b.addr, "confirmed", "k-confirmed", Fault::None).await;
        assert_eq!(
            confirmed,
            Answer {
                status: StatusCode::OK,
                stored: true
            }
        );
        assert_eq!(counts.applied("confirmed"), 1);
    }
    (counts.applied("behind"), first)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_no_replica_confirmed_is_refused_and_the_key_runs_once_after_failover() {
    let (applied, first) = replica_behind(1).await;
    // Never confirmed (the stream is held) within the replica timeout: withdrawn, 503, the
    // handler not run.
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(applied, 1, "applied once, on the promoted replica");
}

/// The control: without waiting, the primary answers before its replica has the claim or the
/// stored response, and the promoted replica runs the key again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_waiting_a_claim_the_replica_never_received_applies_twice() {
    let (applied, first) = replica_behind(0).await;
    assert_eq!(
        first,
        Answer {
            status: StatusCode::OK,
            stored: false
        }
    );
    assert_eq!(applied, 2, "the scenario loses the key without waiting");
}

/// Two replicas of `primary` that have its data, each behind a proxy (its link, to pause).
async fn two_replicas_behind_links(primary: &Node) -> ([Proxy; 2], [Node; 2]) {
    let links = [
        Proxy::start(primary.port).await,
        Proxy::start(primary.port).await,
    ];
    let standby = [
        Node::replica_of(links[0].port),
        Node::replica_of(links[1].port),
    ];
    for replica in &standby {
        replicated(primary, replica);
    }
    (links, standby)
}

/// The primary dies and the first replica is promoted: the second replicates from it, and
/// `front` points to it.
fn fail_over_to_the_first(primary: &mut Node, standby: &[Node; 2], front: &Proxy) {
    primary.kill();
    standby[0].promote();
    let _: String = standby[1]
        .query(
            redis::cmd("REPLICAOF")
                .arg("127.0.0.1")
                .arg(standby[0].port),
        )
        .unwrap();
    replicated(&standby[0], &standby[1]);
    front.point_to(standby[0].port);
}

/// The owner sends its completion again (the layer does so in the background while the key
/// stays in flight) until it is confirmed: the first call may meet the dead primary's
/// connection.
async fn complete_until_confirmed(
    store: &RedisStore,
    token: FencingToken,
    fp: Fingerprint,
    response: &StoredResponse,
) {
    let start = std::time::Instant::now();
    while let Err(err) = store
        .complete("k", token, fp, response.clone(), Duration::from_secs(60))
        .await
    {
        assert!(!err.is_fenced(), "{err}");
        assert!(start.elapsed() < LIMIT, "never confirmed: {err}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A response stored while the replication stream is held back (two replicas, each behind a
/// paused proxy): the store's clients reach the primary through an address that follows the
/// promotion (a proxy re-pointed to the promoted replica, as a managed service's name is).
/// Returns what the promoted replica holds for the key once the owner is done: waiting, the
/// completion was not confirmed, the key stayed in flight, and the owner sent it again to the
/// new primary; not waiting, it was acknowledged, and lost.
async fn unconfirmed_completion(replicas: u32) -> Option<Entry> {
    let mut primary = Node::primary();
    let (links, standby) = two_replicas_behind_links(&primary).await;
    let front = Proxy::start(primary.port).await;
    // Patient (see `instance_on_the_primary`): the claim must be confirmed; the response
    // held back is refused after the patient wait.
    let store = RedisStore::builder(&front.url())
        .wait_for_replicas(replicas)
        .timeout(PATIENT)
        .replica_timeout(PATIENT)
        .prefix("unconfirmed:")
        .connect()
        .await
        .unwrap();
    let fp = fingerprint();
    let Begin::Started(token) = store.begin("k", fp, Duration::from_secs(60)).await.unwrap() else {
        panic!("a fresh key is claimed");
    };
    // Both replicas have the claim (the control does not wait for it: it waits here).
    wait_for("the claim on both replicas", || {
        standby.iter().all(|r| {
            r.query::<Option<Vec<u8>>>(redis::cmd("GET").arg("unconfirmed:k"))
                .is_ok_and(|v| v.is_some())
        })
    });
    for link in &links {
        link.pause();
    }
    let response = ok_response("sent");
    let stored = store
        .complete("k", token, fp, response.clone(), Duration::from_secs(60))
        .await;
    if replicas > 0 {
        let err = stored.expect_err("confirmed with the replicas held back");
        assert!(!err.is_fenced(), "{err}");
    } else {
        stored.expect("acknowledged by the primary alone");
    }

    fail_over_to_the_first(&mut primary, &standby, &front);
    if replicas > 0 {
        complete_until_confirmed(&store, token, fp, &response).await;
    }
    let look = reader(&standby[0].url(), "unconfirmed:").await;
    look.get("k").await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_response_is_stored_again_on_the_promoted_replica() {
    match unconfirmed_completion(1).await {
        Some(Entry::Completed { response, .. }) => assert_eq!(response.body(), "sent"),
        other => panic!("the stored response was lost: {other:?}"),
    }
}

/// The control: not waiting, the primary acknowledges a response its replicas never received;
/// the promoted replica holds only the claim, so a repeat gets 409 until the lease ends and
/// then runs the handler again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_waiting_an_acknowledged_response_is_lost_in_a_failover() {
    let held = unconfirmed_completion(0).await;
    assert!(matches!(held, Some(Entry::InFlight { .. })), "{held:?}");
}
