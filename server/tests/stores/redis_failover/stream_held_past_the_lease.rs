//! Keys across a Redis failover to a replica whose replication stream was held back while it
//! still looked connected (issue 51, item 2): renewals are written on the primary alone, so a
//! replica that receives nothing keeps only the claim's expiry as it last received it. Promoted
//! after that lapsed, it has no claim for a key whose handler is still running, and a repeat
//! runs the handler again — whatever `min-replicas-max-lag` says, since the replica's
//! acknowledgements keep flowing. A lease longer than the handler and the failover together
//! keeps the replica's copy alive through it: the key runs once. The crate docs' guarantee
//! table states both.

use std::time::Duration;

use super::{
    replicated, send, sentinel_field, sentinel_primary, sentinel_sees, wait_for, Answer, LIMIT,
    MASTER,
};
use http::StatusCode;
use retry_safety_testing::fleet::{Counts, Fault, Instance};
use retry_safety_testing::redis::{Node, Proxy, PATIENT};
use tower_idempotency_keys::stores::RedisStore;

const PREFIX: &str = "held-stream:";
/// The raw Redis key of the scenario's idempotency key `k`.
const RAW_KEY: &str = "held-stream:k";

/// Whether `node` holds the scenario's key now (a replica reads an expired key as absent,
/// though it deletes it only when its primary says so).
fn holds_the_key(node: &Node) -> bool {
    node.query::<Option<Vec<u8>>>(redis::cmd("GET").arg(RAW_KEY))
        .is_ok_and(|v| v.is_some())
}

/// An instance through the Sentinel at `sentinel`, waiting for one replica (`replicas`
/// `Some(1)`) or for as many as the primary has at connect (`None`).
async fn instance(
    sentinel: String,
    replicas: Option<u32>,
    lease: Duration,
    counts: &Counts,
) -> Instance {
    Instance::start_with(
        move || async move {
            let mut builder = RedisStore::sentinel([sentinel], MASTER)
                .timeout(PATIENT)
                .replica_timeout(PATIENT);
            if let Some(n) = replicas {
                builder = builder.wait_for_replicas(n);
            }
            builder.connect().await
        },
        PREFIX,
        lease,
        counts.clone(),
    )
    .await
}

/// Waits until the Sentinel has promoted `replica` and settled.
fn promoted_to(sentinel: &Node, replica: &Node) {
    wait_for("the Sentinel to promote the replica", || {
        sentinel_primary(sentinel) == Some(replica.port)
            && sentinel_field(sentinel, "flags").as_deref() == Some("master")
            && replica.replication("role").as_deref() == Some("master")
    });
}

/// A primary whose one replica (behind a proxy) is watched by a Sentinel; the primary refuses
/// writes while no replica has acknowledged within 2 s (`min-replicas-to-write 1`,
/// `min-replicas-max-lag 2`). Instance A claims a key (the replica confirms the claim, `WAIT
/// 1`) and its handler applies and is held; the proxy then holds what the primary sends to the
/// replica, while the replica's acknowledgements flow. If `lapse`, the scenario waits until the
/// replica's copy of the claim has lapsed (renewals no longer reach it) while the primary's
/// stays renewed. The primary dies, the Sentinel promotes the replica, and a repeat goes to
/// instance B. Returns how many times the handler ran once the repeat has its answer.
async fn failover_to_a_replica_whose_stream_was_held(lease: Duration, lapse: bool) -> u32 {
    let mut primary = Node::primary_with(&[
        "--min-replicas-to-write",
        "1",
        "--min-replicas-max-lag",
        "2",
    ]);
    let link = Proxy::start(primary.port).await;
    let replica = Node::replica_of(link.port);
    replicated(&primary, &replica);
    let sentinel = Node::sentinel(MASTER, primary.port);
    sentinel_sees(&sentinel, 1);
    let counts = Counts::default();
    let a = instance(sentinel.url(), Some(1), lease, &counts).await;

    let first = tokio::spawn(send(a.addr, "held", "k", Fault::HeldAfterApply));
    counts.stop_requested().await;
    // The handler ran: its claim was confirmed by the replica (`WAIT 1`, the only one).
    assert!(holds_the_key(&replica), "the replica confirmed the claim");
    link.hold_stream();

    if lapse {
        wait_for("the replica's copy of the claim to lapse", || {
            !holds_the_key(&replica)
        });
        // Renewals kept landing on the primary: the replica still counts as connected and
        // not lagging, as its acknowledgements flow.
        assert!(holds_the_key(&primary), "the owner's renewals were refused");
        assert_eq!(
            primary.replication("connected_slaves").as_deref(),
            Some("1")
        );
    } else {
        assert!(holds_the_key(&replica));
    }

    primary.kill();
    promoted_to(&sentinel, &replica);
    let b = instance(sentinel.url(), None, lease, &counts).await;
    let again = send(b.addr, "held", "k", Fault::None).await;
    if lapse {
        // The promoted replica has no claim for the key: the repeat runs the handler while
        // the owner's still runs.
        assert_eq!(
            again,
            Answer {
                status: StatusCode::OK,
                stored: false
            }
        );
        counts.let_answer();
        return counts.applied("held");
    }

    // The promoted replica holds the claim it confirmed: the repeat waits for the owner, who
    // stores its outcome there (following the Sentinel) and the repeat gets it.
    assert_eq!(again.status, StatusCode::CONFLICT);
    counts.let_answer();
    let first = first.await.expect("the first request's task");
    assert_eq!(
        first.status,
        StatusCode::OK,
        "the first client gets its answer"
    );
    let start = std::time::Instant::now();
    let mut again = again;
    while again.status == StatusCode::CONFLICT {
        assert!(
            start.elapsed() < LIMIT,
            "the owner's outcome never reached the new primary"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        again = send(b.addr, "held", "k", Fault::None).await;
    }
    assert_eq!(
        again,
        Answer {
            status: StatusCode::OK,
            stored: true
        }
    );
    counts.applied("held")
}

/// The documented limit (issue 51, item 2): the replica's stream is held past the lease while
/// its acknowledgements keep it connected and within `min-replicas-max-lag`; promoted, it has
/// no claim for the running handler's key, and the key runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_held_past_the_lease_then_promoted_runs_a_running_key_again() {
    let applied = failover_to_a_replica_whose_stream_was_held(Duration::from_secs(2), true).await;
    assert_eq!(applied, 2);
}

/// What narrows it (issue 51, item 2): a lease longer than the handler and the failover
/// together. The replica's stream is held the same way, but its copy of the confirmed claim
/// outlives both: the key runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_outlasts_the_handler_and_the_failover_keeps_a_held_replica_s_claim() {
    let applied = failover_to_a_replica_whose_stream_was_held(Duration::from_secs(60), false).await;
    assert_eq!(applied, 1);
}
