//! Keys across a Redis failover: a claim and a stored response count as written only once a
//! replica has them (`WAIT`), and a fleet that connects through Sentinel follows the promotion,
//! so every keyed write is applied once. Each scenario runs on a topology of its own
//! (`redis-server` primaries, replicas, a pausable proxy that holds the replication stream back,
//! a Sentinel) on free loopback ports, killed by pid when the test ends; each has a control that
//! shows the scenario really loses the key without the guarantee under test. One scenario is a
//! documented limit instead (`stream_held_past_the_lease`), beside the setting that narrows it.
//!
//! This module holds what the scenarios share (also with `redis_owner` and `redis_stalls`):
//! sending a keyed request, waiting for replication, asking the Sentinel.

mod following_sentinel;
mod stream_held_past_the_lease;
mod waiting_for_replicas;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retry_safety_testing::fleet::Fault;
use retry_safety_testing::redis::{wait_replicated, wait_until, Node, PATIENT};
use tower_idempotency_keys::{stores::RedisStore, Fingerprint, StoreError, StoredResponse};

/// How long any state a scenario waits for may take, on a busy machine.
pub(crate) const LIMIT: Duration = Duration::from_secs(60);
pub(crate) const MASTER: &str = "idem";

/// What a keyed request got back: its status, and whether it was a stored response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) stored: bool,
}

pub(crate) async fn send(to: SocketAddr, op: &str, key: &str, fault: Fault) -> Answer {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let req = Request::post(format!("http://{to}/{op}"))
        .header("idempotency-key", key)
        .header("x-fault", fault.name())
        .body(Full::new(Bytes::from_static(b"{\"to\":\"a@example.com\"}")))
        .unwrap();
    let res = client.request(req).await.expect("the instance answers");
    Answer {
        status: res.status(),
        stored: res.headers().contains_key("idempotent-replayed"),
    }
}

/// `wait_until` (within `LIMIT`) without blocking the runtime's other tasks.
pub(crate) fn wait_for(what: &str, done: impl FnMut() -> bool) {
    tokio::task::block_in_place(|| wait_until(what, LIMIT, done));
}

/// The fingerprint of the calls a scenario makes on a store directly.
pub(crate) fn fingerprint() -> Fingerprint {
    Fingerprint::of(&http::Method::POST, "/v1/send", b"x")
}

/// A stored 200 answer with `body`.
pub(crate) fn ok_response(body: &'static str) -> StoredResponse {
    StoredResponse::new(StatusCode::OK, http::HeaderMap::new(), Bytes::from(body))
}

/// A store that looks at what the node at `url` holds under `prefix` (it waits for no
/// replica, and claims nothing), patient: its reads are the scenario's ground truth.
pub(crate) async fn reader(url: &str, prefix: &str) -> RedisStore {
    RedisStore::builder(url)
        .wait_for_replicas(0)
        .timeout(PATIENT)
        .prefix(prefix)
        .connect()
        .await
        .unwrap()
}

/// Asserts that a connect was refused naming `named` (the setting or input at fault).
pub(crate) fn assert_refused_naming(err: &StoreError, named: &str) {
    let cause = std::error::Error::source(err).map(ToString::to_string);
    assert!(
        cause.as_deref().is_some_and(|c| c.contains(named)),
        "{cause:?}"
    );
}

/// `wait_replicated` without blocking the runtime's other tasks (the proxy runs on them).
pub(crate) fn replicated(primary: &Node, replica: &Node) {
    tokio::task::block_in_place(|| wait_replicated(primary, replica));
}

/// A field of `SENTINEL MASTER` as text.
pub(crate) fn sentinel_field(sentinel: &Node, field: &str) -> Option<String> {
    let fields: Vec<String> = sentinel
        .query(redis::cmd("SENTINEL").arg("MASTER").arg(MASTER))
        .ok()?;
    fields
        .chunks(2)
        .find(|pair| pair[0] == field)
        .map(|pair| pair[1].clone())
}

/// The port of the primary the Sentinel names now.
pub(crate) fn sentinel_primary(sentinel: &Node) -> Option<u16> {
    let addr: Vec<String> = sentinel
        .query(
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(MASTER),
        )
        .ok()?;
    addr.get(1)?.parse().ok()
}

/// Waits until the Sentinel knows `replicas` replicas of the primary.
pub(crate) fn sentinel_sees(sentinel: &Node, replicas: usize) {
    wait_for("the Sentinel to find the replicas", || {
        sentinel_field(sentinel, "num-slaves").and_then(|n| n.parse().ok()) == Some(replicas)
    });
}
