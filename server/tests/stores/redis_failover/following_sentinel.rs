//! Keys across a Redis failover, following Sentinel: a fleet that connects through Sentinel
//! follows the promotion, so a failover mid-handler applies the key once (the control, an owner
//! on a fixed address, applies it twice); a stale owner on a demoted primary is fenced on the
//! new one; Sentinel reaches a primary that requires a password, which no error shows.

use std::net::SocketAddr;
use std::time::Duration;

use super::{
    assert_refused_naming, fingerprint, ok_response, reader, replicated, send, sentinel_field,
    sentinel_primary, sentinel_sees, wait_for, Answer, LIMIT, MASTER,
};
use http::StatusCode;
use retry_safety_testing::fleet::{Counts, Fault, Instance};
use retry_safety_testing::redis::{wait_until, wait_until_async, Node, PATIENT};
use tower_idempotency_keys::{
    stores::RedisStore, Begin, Entry, FencingToken, Fingerprint, IdempotencyStore, StoreError,
};

/// Waits until the Sentinel names a primary other than `old` that has at least one replica
/// connected, and returns its port.
fn promoted(sentinel: &Node, old: u16) -> u16 {
    let mut port = 0;
    tokio::task::block_in_place(|| {
        wait_until("the Sentinel to promote a replica", LIMIT, || {
            let Some(now) = sentinel_primary(sentinel).filter(|p| *p != old) else {
                return false;
            };
            // Settled: not down, no failover in progress (clients skip such a primary).
            if sentinel_field(sentinel, "flags").as_deref() != Some("master") {
                return false;
            }
            port = now;
            let client = redis::Client::open(format!("redis://127.0.0.1:{now}"));
            let info: Option<String> = client
                .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
                .and_then(|mut c| redis::cmd("INFO").arg("replication").query(&mut c))
                .ok();
            info.is_some_and(|i| {
                i.contains("role:master")
                    && !i.contains("connected_slaves:0")
                    && i.contains("state=online")
            })
        })
    });
    port
}

/// Calls `call` until it is fenced: a store error first (a connection made before a failover)
/// is allowed, a success never.
async fn fenced<F, Fut>(mut call: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), tower_idempotency_keys::StoreError>>,
{
    for _ in 0..5 {
        let err = call().await.expect_err("a stale owner wrote");
        if err.is_fenced() {
            return;
        }
    }
    panic!("never fenced");
}

/// A primary with `N` replicas that have its data, and a Sentinel that watches it and knows
/// them.
fn watched_primary<const N: usize>() -> (Node, [Node; N], Node) {
    let primary = Node::primary();
    let replicas: [Node; N] = std::array::from_fn(|_| Node::replica_of(primary.port));
    for replica in &replicas {
        replicated(&primary, replica);
    }
    let sentinel = Node::sentinel(MASTER, primary.port);
    sentinel_sees(&sentinel, N);
    (primary, replicas, sentinel)
}

/// An instance's store, patient and waiting for one replica: through the Sentinel at
/// `sentinel` (`follow`), or on the fixed address `url`.
async fn connect_store(
    follow: bool,
    sentinel: String,
    url: String,
) -> Result<RedisStore, StoreError> {
    let builder = if follow {
        RedisStore::sentinel([sentinel], MASTER)
    } else {
        RedisStore::builder(&url)
    };
    builder
        .wait_for_replicas(1)
        .timeout(PATIENT)
        .replica_timeout(PATIENT)
        .connect()
        .await
}

/// Following Sentinel: the owner stores the response on the new primary at `new_url` (a read:
/// it claims nothing), and a repeat to the instance at `b` is answered from it.
async fn stored_response_from_the_new_primary(new_url: &str, b: SocketAddr) {
    let look = reader(new_url, "mid:").await;
    wait_until_async("the response stored on the new primary", LIMIT, || {
        let look = look.clone();
        async move { matches!(look.get("k-held").await, Ok(Some(Entry::Completed { .. }))) }
    })
    .await;
    let again = send(b, "held", "k-held", Fault::None).await;
    assert_eq!(
        again,
        Answer {
            status: StatusCode::OK,
            stored: true
        }
    );
}

/// On a fixed address: a repeat to the instance at `b` gets 409 while the dead owner's claim
/// lasts on the new primary, then a fresh run.
async fn run_again_once_the_claim_ends(b: SocketAddr) {
    let mut again = send(b, "held", "k-held", Fault::None).await;
    let start = std::time::Instant::now();
    while again.status == StatusCode::CONFLICT {
        assert!(start.elapsed() < LIMIT, "the claim never ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
        again = send(b, "held", "k-held", Fault::None).await;
    }
    assert_eq!(
        again,
        Answer {
            status: StatusCode::OK,
            stored: false
        }
    );
}

/// A handler is running when its primary dies; a Sentinel promotes one of two replicas (the
/// claim is on both: confirmed before the handler ran). With `follow`, both instances reach
/// the primary through the Sentinel: the owner stores its response on the new primary and the
/// repeat is answered from it. Without, the owner keeps the dead primary's address: its
/// response is never stored where the fleet looks, and once its lease ends a repeat runs the
/// handler again. Returns how many times the handler ran.
async fn failover_mid_handler(follow: bool) -> u32 {
    let (mut primary, _replicas, sentinel) = watched_primary::<2>();
    let counts = Counts::default();
    let lease = Duration::from_secs(1);
    let connect = |url: String| {
        let sentinel = sentinel.url();
        move || connect_store(follow, sentinel, url)
    };
    let a = Instance::start_with(connect(primary.url()), "mid:", lease, counts.clone()).await;
    let first = tokio::spawn(send(a.addr, "held", "k-held", Fault::HeldAfterApply));
    counts.stop_requested().await;
    primary.kill();
    let now = promoted(&sentinel, primary.port);
    let new_url = format!("redis://127.0.0.1:{now}");
    let b = Instance::start_with(connect(new_url.clone()), "mid:", lease, counts.clone()).await;
    counts.let_answer();
    let first = first.await.unwrap();
    assert_eq!(
        first.status,
        StatusCode::OK,
        "the first client gets its answer"
    );

    if follow {
        stored_response_from_the_new_primary(&new_url, b.addr).await;
    } else {
        run_again_once_the_claim_ends(b.addr).await;
    }
    counts.applied("held")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_mid_handler_followed_through_sentinel_applies_once() {
    assert_eq!(failover_mid_handler(true).await, 1);
}

/// The control: an owner that keeps the dead primary's address loses its stored response, and
/// the key runs again after its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_mid_handler_on_a_fixed_address_applies_twice() {
    assert_eq!(failover_mid_handler(false).await, 2);
}

/// Impossible settings are refused at connect, naming the input.
async fn impossible_settings_are_refused(primary: &Node, replica: &Node) {
    for (builder, named) in [
        (
            RedisStore::builder(&primary.url()).wait_for_replicas(2),
            "wait_for_replicas(2)",
        ),
        (
            RedisStore::builder(&primary.url()).replica_timeout(Duration::ZERO),
            "replica_timeout(0)",
        ),
        (
            RedisStore::builder(&replica.url()),
            "replica, not a primary",
        ),
    ] {
        let err = builder.connect().await.expect_err(named);
        assert_refused_naming(&err, named);
    }
}

/// The two stores of the stale owner: one through the Sentinel (it finds the one replica at
/// connect), one held to the current primary's address.
async fn stale_owner_stores(sentinel: &Node, primary: &Node) -> (RedisStore, RedisStore) {
    let stale = RedisStore::sentinel([sentinel.url()], MASTER)
        .prefix("stale:")
        .timeout(PATIENT)
        .replica_timeout(PATIENT)
        .connect()
        .await
        .unwrap();
    assert_eq!(
        stale.replicas_waited_for(),
        1,
        "one replica found at connect"
    );
    let fixed = RedisStore::builder(&primary.url())
        .prefix("stale:")
        .timeout(PATIENT)
        .connect()
        .await
        .unwrap();
    (stale, fixed)
}

/// `SENTINEL FAILOVER`: `replica` is promoted, and `primary` demoted to its replica.
fn coordinated_failover(sentinel: &Node, primary: &Node, replica: &Node) {
    // Refused (NOGOODSLAVE) until the Sentinel has read the replica's state: asked again.
    wait_for("the Sentinel to start a failover", || {
        sentinel
            .query::<String>(redis::cmd("SENTINEL").arg("FAILOVER").arg(MASTER))
            .is_ok()
    });
    let now = promoted(sentinel, primary.port);
    assert_eq!(now, replica.port);
    wait_for("the old primary to be demoted", || {
        primary.replication("role").as_deref() == Some("slave")
    });
    replicated(replica, primary);
}

/// The newer owner's store on `new_primary`, once it has taken the stale owner's key there and
/// stored its response.
async fn a_newer_owner_completes(new_primary: &Node, fp: Fingerprint) -> RedisStore {
    // The stale owner's claim lapses on the new primary (nothing renews it) ...
    wait_for("the stale claim to lapse", || {
        new_primary
            .query::<Option<Vec<u8>>>(redis::cmd("GET").arg("stale:k"))
            .is_ok_and(|v| v.is_none())
    });
    // ... and a newer owner takes the key there and stores its response.
    let newer = RedisStore::builder(&new_primary.url())
        .prefix("stale:")
        .timeout(PATIENT)
        .replica_timeout(PATIENT)
        .connect()
        .await
        .unwrap();
    let Begin::Started(new_claim) = newer.begin("k", fp, Duration::from_secs(60)).await.unwrap()
    else {
        panic!("the lapsed key is claimed again");
    };
    newer
        .complete(
            "k",
            new_claim,
            fp,
            ok_response("newer"),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    newer
}

/// The stale owner (its claim `old_claim`) is fenced, twice over: it neither stores its
/// outcome nor renews.
async fn the_stale_owner_is_fenced(stale: &RedisStore, old_claim: FencingToken, fp: Fingerprint) {
    for _ in 0..2 {
        fenced(|| {
            stale.complete(
                "k",
                old_claim,
                fp,
                ok_response("stale"),
                Duration::from_secs(60),
            )
        })
        .await;
        fenced(|| stale.renew("k", old_claim, Duration::from_secs(60))).await;
    }
}

/// Held to the demoted node's address: READONLY is a store error, not a claim (the first
/// call may meet the connection Sentinel closed; the next ones reach the demoted node).
async fn the_demoted_address_takes_no_claim(fixed: &RedisStore, fp: Fingerprint) {
    let mut causes = Vec::new();
    for _ in 0..3 {
        let err = fixed
            .begin("k-fixed", fp, Duration::from_secs(60))
            .await
            .expect_err("a demoted primary took a claim");
        assert!(!err.is_fenced());
        causes.extend(std::error::Error::source(&err).map(ToString::to_string));
    }
    assert!(causes.iter().any(|c| c.contains("ReadOnly")), "{causes:?}");
}

/// A coordinated failover (`SENTINEL FAILOVER`) demotes the primary, which then answers writes
/// with `READONLY`. A store that follows Sentinel sends its calls to the new primary, where the
/// fencing token still rules: the stale owner of a claim that lapsed and was taken over
/// neither renews it nor overwrites the newer owner's entry. A store held to the demoted
/// node's address gets a store error (503), never a fresh claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owner_on_a_demoted_primary_is_fenced_on_the_new_one() {
    let (primary, [replica], sentinel) = watched_primary::<1>();
    let fp = fingerprint();
    impossible_settings_are_refused(&primary, &replica).await;

    let (stale, fixed) = stale_owner_stores(&sentinel, &primary).await;
    let Begin::Started(old_claim) = stale
        .begin("k", fp, Duration::from_millis(300))
        .await
        .unwrap()
    else {
        panic!("a fresh key is claimed");
    };

    coordinated_failover(&sentinel, &primary, &replica);
    let newer = a_newer_owner_completes(&replica, fp).await;

    // The stale owner's connection reaches the demoted node (Sentinel closed its clients at
    // the failover: a call on a connection made before it fails as a store error, and the
    // connections are made afresh), follows Sentinel to the new primary, and is fenced there:
    // it neither stores its outcome over the newer one nor renews.
    the_stale_owner_is_fenced(&stale, old_claim, fp).await;
    match newer.get("k").await.unwrap() {
        Some(Entry::Completed { response, .. }) => assert_eq!(response.body(), "newer"),
        other => panic!("the newer entry was lost: {other:?}"),
    }
    // Through Sentinel, new keys go to the new primary.
    assert!(matches!(
        stale.begin("k-new", fp, Duration::from_secs(60)).await,
        Ok(Begin::Started(_))
    ));

    the_demoted_address_takes_no_claim(&fixed, fp).await;
    assert!(newer.get("k-fixed").await.unwrap().is_none());
}

/// A primary that requires a password, reached through a Sentinel: the store authenticates
/// with `primary_auth`; without it, connecting fails; the password appears in no error and no
/// `Debug`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_reaches_a_primary_that_requires_a_password() {
    const PASSWORD: &str = "s3cret-Kx9q";
    let primary = Node::primary_with_password(PASSWORD);
    let replica = Node::replica_with_password(primary.port, PASSWORD);
    replicated(&primary, &replica);
    let sentinel = Node::sentinel_with(
        MASTER,
        primary.port,
        &format!("sentinel auth-pass {MASTER} {PASSWORD}\n"),
    );
    sentinel_sees(&sentinel, 1);

    let builder = RedisStore::sentinel([sentinel.url()], MASTER)
        .primary_auth(None, PASSWORD)
        .prefix("auth:")
        .timeout(PATIENT)
        .replica_timeout(PATIENT);
    assert!(!format!("{builder:?}").contains(PASSWORD));
    let store = builder.connect().await.unwrap();
    assert!(!format!("{store:?}").contains(PASSWORD));
    assert_eq!(store.replicas_waited_for(), 1);
    let fp = Fingerprint::of(&http::Method::POST, "/v1/send", b"x");
    let began = store.begin("k", fp, Duration::from_secs(60)).await;
    assert!(matches!(began, Ok(Begin::Started(_))), "{began:?}");

    let err = RedisStore::sentinel([sentinel.url()], MASTER)
        .connect()
        .await
        .expect_err("a primary that requires a password took none");
    let shown = format!("{err} {err:?} {:?}", std::error::Error::source(&err));
    assert!(!shown.contains(PASSWORD), "{shown}");
    // A URL's password stays out of errors too.
    let err = RedisStore::builder(&format!("redis://:{PASSWORD}@127.0.0.1:1"))
        .connect()
        .await
        .expect_err("nothing listens on port 1");
    let shown = format!("{err} {err:?} {:?}", std::error::Error::source(&err));
    assert!(!shown.contains(PASSWORD), "{shown}");
}
