//! Keys on a Redis Cluster: `RedisStore::cluster` over a 3-primary cluster (one replica each)
//! started on free loopback ports. Each key's claim, entry and fencing token are one Redis key, in
//! one hash slot; calls are routed by slot and wait for the key's own replica; a coordinated
//! failover of a shard (`CLUSTER FAILOVER`) is followed by the client (`MOVED`, slot refresh),
//! and so is a key's hash slot migrated to another primary while its handler runs (`ASK`, then
//! `MOVED`).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retry_safety_testing::fleet::{Counts, Fault, Instance};
use retry_safety_testing::redis::{wait_until, Cluster, Node, PATIENT};
use tower_idempotency_keys::stores::RedisStore;

const LIMIT: Duration = Duration::from_secs(60);
const KEYS: usize = 24;

/// Sends a keyed request until it is answered other than 503 (a store call that met a
/// connection closed by a failover); returns the status and whether it was a stored response.
async fn send(to: SocketAddr, op: &str, key: &str) -> (StatusCode, bool) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let start = std::time::Instant::now();
    loop {
        let req = Request::post(format!("http://{to}/{op}"))
            .header("idempotency-key", key)
            .header("x-fault", Fault::None.name())
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let res = client.request(req).await.expect("the instance answers");
        if res.status() != StatusCode::SERVICE_UNAVAILABLE {
            return (
                res.status(),
                res.headers().contains_key("idempotent-replayed"),
            );
        }
        assert!(start.elapsed() < LIMIT, "503 for {LIMIT:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An instance whose store is `RedisStore::cluster` over `seed` (patient timeouts), with
/// `prefix` and `lease`.
async fn cluster_instance(
    seed: Vec<String>,
    prefix: &str,
    lease: Duration,
    counts: Counts,
) -> Instance {
    Instance::start_with(
        move || async move {
            RedisStore::cluster(&seed)
                .timeout(PATIENT)
                .replica_timeout(PATIENT)
                .connect()
                .await
        },
        prefix,
        lease,
        counts,
    )
    .await
}

/// The cluster's nodes whose replication role is `role` (`master` or `slave`).
fn with_role<'a>(cluster: &'a Cluster, role: &str) -> Vec<&'a Node> {
    cluster
        .nodes
        .iter()
        .filter(|n| n.replication("role").as_deref() == Some(role))
        .collect()
}

/// Each of `replicas` takes over its primary's slots (`CLUSTER FAILOVER`), then the cluster
/// settles: every replica a primary, every node `cluster_state:ok`, each primary one replica.
///
/// One shard at a time: manual failovers started together ask for votes in the same epoch,
/// and a primary votes once per epoch, so all but one can time out and leave their replica
/// a replica (seen twice in a row on a loaded machine).
fn fail_over_one_shard_at_a_time(cluster: &Cluster, replicas: &[&Node]) {
    for node in replicas {
        let _: String = node
            .query(redis::cmd("CLUSTER").arg("FAILOVER"))
            .expect("CLUSTER FAILOVER");
        tokio::task::block_in_place(|| {
            wait_until("a replica to take over its shard", LIMIT, || {
                node.replication("role").as_deref() == Some("master")
            })
        });
    }
    tokio::task::block_in_place(|| {
        wait_until("the replicas to take over", LIMIT, || {
            replicas
                .iter()
                .all(|n| n.replication("role").as_deref() == Some("master"))
                && cluster.nodes.iter().all(|n| {
                    n.query::<String>(redis::cmd("CLUSTER").arg("INFO"))
                        .is_ok_and(|i| i.contains("cluster_state:ok"))
                })
                && cluster
                    .nodes
                    .iter()
                    .filter(|n| n.replication("role").as_deref() == Some("master"))
                    .all(|n| n.replication("connected_slaves").as_deref() == Some("1"))
        })
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_runs_each_key_once_across_slots_and_a_shard_failover() {
    let cluster = tokio::task::block_in_place(|| Cluster::start(3, 1));
    let seed = cluster.urls()[..1].to_vec();
    let store = RedisStore::cluster(&seed)
        .timeout(PATIENT)
        .replica_timeout(PATIENT)
        .connect()
        .await
        .unwrap();
    assert_eq!(
        store.replicas_waited_for(),
        1,
        "one replica per primary found"
    );
    drop(store);

    let counts = Counts::default();
    let a = cluster_instance(seed, "cluster:", Duration::from_secs(5), counts.clone()).await;

    // Keys across the slots (and so the primaries): each runs once, then answers from its stored
    // response.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..KEYS {
        let addr = a.addr;
        tasks.spawn(async move { send(addr, &format!("op-{i}"), &format!("key-{i}")).await });
    }
    while let Some(answer) = tasks.join_next().await {
        assert_eq!(answer.unwrap(), (StatusCode::OK, false));
    }
    // One key, 32 requests at once: one runs, the others get 409 or the stored response.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..32 {
        let addr = a.addr;
        tasks.spawn(async move { send(addr, "same", "same-key").await });
    }
    while let Some(answer) = tasks.join_next().await {
        let (status, _) = answer.unwrap();
        assert!(
            status == StatusCode::OK || status == StatusCode::CONFLICT,
            "{status}"
        );
    }
    assert_eq!(counts.applied("same"), 1);

    // A coordinated failover of every shard: each replica takes over its primary's slots.
    let replicas = with_role(&cluster, "slave");
    assert_eq!(replicas.len(), 3);
    fail_over_one_shard_at_a_time(&cluster, &replicas);

    // Every key's entry is on the new primaries: answered from it, never run again.
    for i in 0..KEYS {
        let answer = send(a.addr, &format!("op-{i}"), &format!("key-{i}")).await;
        assert_eq!(answer, (StatusCode::OK, true), "key-{i}");
        assert_eq!(counts.applied(&format!("op-{i}")), 1, "key-{i}");
    }
    let answer = send(a.addr, "same", "same-key").await;
    assert_eq!(answer, (StatusCode::OK, true));
    assert_eq!(counts.applied("same"), 1);
    // New keys are claimed on the new primaries.
    assert_eq!(
        send(a.addr, "after", "after-key").await,
        (StatusCode::OK, false)
    );
    assert_eq!(counts.total_applied(), KEYS as u32 + 2);
}

/// Sends a keyed request once (`fault` for its operation's first attempt); returns the status,
/// whether it was a stored response, and the body.
async fn send_once(to: SocketAddr, op: &str, key: &str, fault: Fault) -> (StatusCode, bool, Bytes) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let req = Request::post(format!("http://{to}/{op}"))
        .header("idempotency-key", key)
        .header("x-fault", fault.name())
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let res = client.request(req).await.expect("the instance answers");
    let status = res.status();
    let stored = res.headers().contains_key("idempotent-replayed");
    let body = res
        .into_body()
        .collect()
        .await
        .expect("the body")
        .to_bytes();
    (status, stored, body)
}

/// The hash slot of `key` (`CLUSTER KEYSLOT`, asked of `node`).
fn key_slot(node: &Node, key: &str) -> u16 {
    node.query(redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
        .expect("CLUSTER KEYSLOT")
}

/// The node's cluster id.
fn id(node: &Node) -> String {
    node.query(redis::cmd("CLUSTER").arg("MYID"))
        .expect("CLUSTER MYID")
}

/// The id of the primary that owns `slot`, as `node` sees it (`CLUSTER NODES`; a slot being
/// migrated or imported is listed as `[slot->-id]` / `[slot-<-id]`, not as owned).
fn owner_seen_by(node: &Node, slot: u16) -> Option<String> {
    let nodes: String = node.query(redis::cmd("CLUSTER").arg("NODES")).ok()?;
    nodes.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let owns = fields.get(2)?.contains("master")
            && fields.iter().skip(8).any(|range| {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                match (lo.parse::<u16>(), hi.parse::<u16>()) {
                    (Ok(lo), Ok(hi)) => (lo..=hi).contains(&slot),
                    _ => false,
                }
            });
        owns.then(|| fields[0].to_owned())
    })
}

/// Keys of `slot` held by `node` itself (`CLUSTER COUNTKEYSINSLOT`: owner or not).
fn keys_in_slot(node: &Node, slot: u16) -> u64 {
    node.query(redis::cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(slot))
        .expect("CLUSTER COUNTKEYSINSLOT")
}

/// `PTTL` of `key` on a node importing its slot (`ASKING` first, as a client sent there by
/// `ASK` does).
fn pttl_importing(node: &Node, key: &str) -> i64 {
    let mut conn = redis::Client::open(node.url())
        .and_then(|c| c.get_connection())
        .expect("a connection to the node");
    let (pttl,): (i64,) = redis::pipe()
        .cmd("ASKING")
        .ignore()
        .cmd("PTTL")
        .arg(key)
        .query(&mut conn)
        .expect("ASKING, PTTL");
    pttl
}

/// Of `primaries`, the one that owns `slot` and another: (source, its id, target, its id).
fn owner_and_another<'a>(
    primaries: &[&'a Node],
    slot: u16,
) -> (&'a Node, String, &'a Node, String) {
    let src_id = owner_seen_by(primaries[0], slot).expect("the slot has an owner");
    let src = *primaries
        .iter()
        .find(|n| id(n) == src_id)
        .expect("the owner is a primary");
    let dst = *primaries
        .iter()
        .find(|n| id(n) != src_id)
        .expect("another primary");
    let dst_id = id(dst);
    (src, src_id, dst, dst_id)
}

/// `CLUSTER SETSLOT slot state id` on `node` (`IMPORTING`, `MIGRATING` or `NODE`).
fn set_slot(node: &Node, slot: u16, state: &str, id: &str) {
    let _: String = node
        .query(
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg(state)
                .arg(id),
        )
        .unwrap_or_else(|e| panic!("SETSLOT {state}: {e:?}"));
}

/// The keys of `slot` that `node` holds (`CLUSTER GETKEYSINSLOT`, up to 100).
fn keys_of_slot(node: &Node, slot: u16) -> Vec<String> {
    node.query(
        redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(100),
    )
    .expect("GETKEYSINSLOT")
}

/// Moves `keys` from `src` to `dst` (`MIGRATE ... KEYS`).
fn migrate(src: &Node, dst: &Node, keys: &[String]) {
    let _: String = src
        .query(
            redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(dst.port)
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(keys),
        )
        .expect("MIGRATE");
}

/// Waits until the claim `redis_key` is renewed on `dst`, which imports its slot (its expiry
/// moves back up); the claim must never be gone from `dst` meanwhile.
fn wait_for_renewal_on(dst: &Node, redis_key: &str) {
    tokio::task::block_in_place(|| {
        let mut last = pttl_importing(dst, redis_key);
        wait_until("a renewal on the new owner", LIMIT, || {
            let now = pttl_importing(dst, redis_key);
            assert!(now > 0, "the claim is gone from the new owner ({now})");
            let renewed = now > last;
            last = now;
            renewed
        });
    });
}

/// Waits until every node of `cluster` sees `owner_id` own `slot`.
fn wait_for_every_node_to_see(cluster: &Cluster, slot: u16, owner_id: &str) {
    tokio::task::block_in_place(|| {
        wait_until("every node to see the new owner", LIMIT, || {
            cluster
                .nodes
                .iter()
                .all(|n| owner_seen_by(n, slot).as_deref() == Some(owner_id))
        })
    });
}

/// Covers a slot migration mid-handler (issue 36): while a keyed write's handler runs, the
/// key's hash slot moves to another primary the standard way (`IMPORTING` on the target,
/// `MIGRATING` on the source, `MIGRATE` of the slot's keys, `SETSLOT NODE` on every primary).
/// The claim is renewed on the new owner (through `ASK`), repeats meanwhile get 409 at every
/// step, the handler runs exactly once, and its stored response lands on the new owner, where
/// a repeat afterwards is answered from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrated_mid_handler_neither_loses_nor_repeats_its_key() {
    let cluster = tokio::task::block_in_place(|| Cluster::start(3, 1));
    let seed = cluster.urls()[..1].to_vec();
    let counts = Counts::default();
    let prefix = "slots:";
    let (op, key) = ("moving", "moving-key");
    // The store's Redis key: its prefix and the idempotency key, no hash tag.
    let redis_key = format!("{prefix}{key}");
    // A lease short enough that the claim must be renewed on the new owner to survive.
    let a = cluster_instance(seed, prefix, Duration::from_secs(2), counts.clone()).await;

    let slot = key_slot(&cluster.nodes[0], &redis_key);
    let primaries: Vec<&Node> = with_role(&cluster, "master");
    assert_eq!(primaries.len(), 3);
    let (src, src_id, dst, dst_id) = owner_and_another(&primaries, slot);

    // The first request: its handler applies, then is held until the test lets it answer.
    let first = tokio::spawn(send_once(a.addr, op, key, Fault::HeldAfterApply));
    tokio::time::timeout(LIMIT, counts.stop_requested())
        .await
        .expect("the handler to run");
    assert_eq!(counts.applied(op), 1);
    assert_eq!(keys_in_slot(src, slot), 1, "the claim is on the source");
    let repeat = || send_once(a.addr, op, key, Fault::None);

    // 1. The slot is migrating; the claim is still on the source.
    set_slot(dst, slot, "IMPORTING", &src_id);
    set_slot(src, slot, "MIGRATING", &dst_id);
    assert_eq!(repeat().await.0, StatusCode::CONFLICT, "slot migrating");

    // 2. The slot's keys move; the source still owns the slot and sends callers on (`ASK`).
    let keys = keys_of_slot(src, slot);
    assert_eq!(keys, [redis_key.as_str()]);
    migrate(src, dst, &keys);
    assert_eq!(keys_in_slot(src, slot), 0);
    assert_eq!(keys_in_slot(dst, slot), 1);
    assert_eq!(repeat().await.0, StatusCode::CONFLICT, "keys migrated");
    // The claim is renewed on the new owner (its expiry moves back up), never lost.
    wait_for_renewal_on(dst, &redis_key);
    assert_eq!(repeat().await.0, StatusCode::CONFLICT, "claim renewed");

    // 3. The new owner owns the slot, on every primary; every node comes to agree.
    for node in [dst, src].into_iter().chain(
        primaries
            .iter()
            .copied()
            .filter(|n| id(n) != src_id && id(n) != dst_id),
    ) {
        set_slot(node, slot, "NODE", &dst_id);
    }
    wait_for_every_node_to_see(&cluster, slot, &dst_id);
    assert_eq!(repeat().await.0, StatusCode::CONFLICT, "slot moved");
    assert_eq!(counts.applied(op), 1, "no repeat ran the handler");

    // The handler answers: its response is stored on the new owner.
    counts.let_answer();
    let answer = tokio::time::timeout(LIMIT, first)
        .await
        .expect("the first request answered")
        .unwrap();
    assert_eq!(
        answer,
        (StatusCode::OK, false, Bytes::from_static(b"sent")),
        "the first request gets its own answer"
    );
    assert_eq!(
        repeat().await,
        (StatusCode::OK, true, Bytes::from_static(b"sent")),
        "a repeat gets the stored response"
    );
    assert_eq!(counts.applied(op), 1);
    assert_eq!(counts.total_applied(), 1);
    assert_eq!(keys_in_slot(src, slot), 0);
    assert_eq!(keys_in_slot(dst, slot), 1, "the entry is on the new owner");
    let entry: Option<Vec<u8>> = dst
        .query(redis::cmd("GET").arg(&redis_key))
        .expect("GET on the new owner");
    assert!(entry.is_some_and(|r| !r.is_empty()));
}
