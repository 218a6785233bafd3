//! Keys across a Redis failover: a claim and a stored response count as written only once a
//! replica has them (`WAIT`), and a fleet that connects through Sentinel follows the promotion,
//! so every keyed write is applied once. Each scenario runs on a topology of its own
//! (`redis-server` primaries, replicas, a pausable proxy that holds the replication stream back,
//! a Sentinel) on free loopback ports, killed by pid when the test ends; each has a control that
//! shows the scenario really loses the key without the guarantee under test.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::fleet::{Counts, Fault, Instance};
use crate::support::redis::{wait_replicated, wait_until, wait_until_async, Node, Proxy, PATIENT};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower_idempotency_keys::{
    Begin, Entry, Fingerprint, IdempotencyStore, RedisStore, StoredResponse,
};

/// How long any state a scenario waits for may take, on a busy machine.
pub(crate) const LIMIT: Duration = Duration::from_secs(60);
pub(crate) const MASTER: &str = "idem";

/// What a keyed request got back: its status, and whether it was a stored response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) replayed: bool,
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
        replayed: res.headers().contains_key("idempotent-replayed"),
    }
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
    tokio::task::block_in_place(|| {
        wait_until("the Sentinel to find the replicas", LIMIT, || {
            sentinel_field(sentinel, "num-slaves").and_then(|n| n.parse().ok()) == Some(replicas)
        })
    });
}

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
    let url = primary.url();
    let a = Instance::start_with(
        move || async move {
            RedisStore::builder(&url)
                .wait_for_replicas(replicas)
                .replica_timeout(Duration::from_millis(300))
                .connect()
                .await
        },
        "failover:",
        Duration::from_secs(5),
        counts.clone(),
    )
    .await;

    if replicas > 0 {
        // A key answered while the stream flows: confirmed on the replica before the answer,
        // it is replayed from the promoted replica below.
        let answer = send(a.addr, "confirmed", "k-confirmed", Fault::None).await;
        assert_eq!(answer.status, StatusCode::OK);
    }

    proxy.pause();
    let first = send(a.addr, "behind", "k-behind", Fault::None).await;
    primary.kill();
    replica.promote();

    // The promoted replica has no replica of its own: waiting for one is refused at connect,
    // naming the setting.
    let refused = RedisStore::builder(&replica.url())
        .wait_for_replicas(1)
        .connect()
        .await
        .expect_err("no replica to wait for");
    let cause = std::error::Error::source(&refused).map(ToString::to_string);
    assert!(
        cause
            .as_deref()
            .is_some_and(|c| c.contains("wait_for_replicas(1)")),
        "{cause:?}"
    );

    let url = replica.url();
    let b = Instance::start_with(
        move || async move {
            RedisStore::builder(&url)
                .wait_for_replicas(0)
                .connect()
                .await
        },
        "failover:",
        Duration::from_secs(5),
        counts.clone(),
    )
    .await;
    let again = send(b.addr, "behind", "k-behind", Fault::None).await;
    assert_eq!(
        again,
        Answer {
            status: StatusCode::OK,
            replayed: false
        }
    );
    if replicas > 0 {
        let confirmed = send(b.addr, "confirmed", "k-confirmed", Fault::None).await;
        assert_eq!(
            confirmed,
            Answer {
                status: StatusCode::OK,
                replayed: true
            }
        );
        assert_eq!(counts.applied("confirmed"), 1);
    }
    (counts.applied("behind"), first)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_no_replica_confirmed_is_refused_and_the_key_runs_once_after_failover() {
    let (applied, first) = replica_behind(1).await;
    // Not confirmed within the replica timeout: withdrawn, 503, the handler not run.
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
            replayed: false
        }
    );
    assert_eq!(applied, 2, "the scenario loses the key without waiting");
}

/// A handler is running when its primary dies; a Sentinel promotes one of two replicas (the
/// claim is on both: confirmed before the handler ran). With `follow`, both instances reach
/// the primary through the Sentinel: the owner stores its response on the new primary and the
/// repeat is answered from it. Without, the owner keeps the dead primary's address: its
/// response is never stored where the fleet looks, and once its lease ends a repeat runs the
/// handler again. Returns how many times the handler ran.
async fn failover_mid_handler(follow: bool) -> u32 {
    let mut primary = Node::primary();
    let replicas = [
        Node::replica_of(primary.port),
        Node::replica_of(primary.port),
    ];
    for replica in &replicas {
        replicated(&primary, replica);
    }
    let sentinel = Node::sentinel(MASTER, primary.port);
    sentinel_sees(&sentinel, 2);
    let counts = Counts::default();
    let lease = Duration::from_secs(1);
    let connect = |url: String| {
        let sentinel = sentinel.url();
        move || async move {
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
        // The owner stores the response on the new primary (a read: it claims nothing).
        let look = RedisStore::builder(&new_url)
            .wait_for_replicas(0)
            .prefix("mid:")
            .connect()
            .await
            .unwrap();
        wait_until_async("the response stored on the new primary", LIMIT, || {
            let look = look.clone();
            async move { matches!(look.get("k-held").await, Ok(Some(Entry::Completed { .. }))) }
        })
        .await;
        let again = send(b.addr, "held", "k-held", Fault::None).await;
        assert_eq!(
            again,
            Answer {
                status: StatusCode::OK,
                replayed: true
            }
        );
    } else {
        // 409 while the dead owner's claim lasts on the new primary, then a fresh run.
        let mut again = send(b.addr, "held", "k-held", Fault::None).await;
        let start = std::time::Instant::now();
        while again.status == StatusCode::CONFLICT {
            assert!(start.elapsed() < LIMIT, "the claim never ended");
            tokio::time::sleep(Duration::from_millis(50)).await;
            again = send(b.addr, "held", "k-held", Fault::None).await;
        }
        assert_eq!(
            again,
            Answer {
                status: StatusCode::OK,
                replayed: false
            }
        );
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

/// A coordinated failover (`SENTINEL FAILOVER`) demotes the primary, which then answers writes
/// with `READONLY`. A store that follows Sentinel sends its calls to the new primary, where the
/// fencing token still rules: the stale owner of a claim that lapsed and was taken over
/// neither renews it nor overwrites the newer owner's record. A store held to the demoted
/// node's address gets a store error (503), never a fresh claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owner_on_a_demoted_primary_is_fenced_on_the_new_one() {
    let primary = Node::primary();
    let replica = Node::replica_of(primary.port);
    replicated(&primary, &replica);
    let sentinel = Node::sentinel(MASTER, primary.port);
    sentinel_sees(&sentinel, 1);
    let fp = Fingerprint::of(&http::Method::POST, "/v1/send", b"x");
    let response = |body: &'static str| {
        StoredResponse::new(StatusCode::OK, http::HeaderMap::new(), Bytes::from(body))
    };

    // Impossible settings are refused at connect, naming the input.
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
        let cause = std::error::Error::source(&err).map(ToString::to_string);
        assert!(
            cause.as_deref().is_some_and(|c| c.contains(named)),
            "{cause:?}"
        );
    }

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
        .connect()
        .await
        .unwrap();
    let Begin::Started(old_claim) = stale
        .begin("k", fp, Duration::from_millis(300))
        .await
        .unwrap()
    else {
        panic!("a fresh key is claimed");
    };

    // Refused (NOGOODSLAVE) until the Sentinel has read the replica's state: asked again.
    tokio::task::block_in_place(|| {
        wait_until("the Sentinel to start a failover", LIMIT, || {
            sentinel
                .query::<String>(redis::cmd("SENTINEL").arg("FAILOVER").arg(MASTER))
                .is_ok()
        })
    });
    let now = promoted(&sentinel, primary.port);
    assert_eq!(now, replica.port);
    tokio::task::block_in_place(|| {
        wait_until("the old primary to be demoted", LIMIT, || {
            primary.replication("role").as_deref() == Some("slave")
        })
    });
    replicated(&replica, &primary);
    // The stale owner's claim lapses on the new primary (nothing renews it) ...
    tokio::task::block_in_place(|| {
        wait_until("the stale claim to lapse", LIMIT, || {
            replica
                .query::<Option<Vec<u8>>>(redis::cmd("GET").arg("stale:k"))
                .is_ok_and(|v| v.is_none())
        })
    });
    // ... and a newer owner takes the key there and stores its response.
    let newer = RedisStore::builder(&replica.url())
        .prefix("stale:")
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
            response("newer"),
            Duration::from_secs(60),
        )
        .await
        .unwrap();

    // The stale owner's connection reaches the demoted node (Sentinel closed its clients at
    // the failover: a call on a connection made before it fails as a store error, and the
    // connections are made afresh), follows Sentinel to the new primary, and is fenced there:
    // it neither stores its outcome over the newer one nor renews.
    for _ in 0..2 {
        fenced(|| {
            stale.complete(
                "k",
                old_claim,
                fp,
                response("stale"),
                Duration::from_secs(60),
            )
        })
        .await;
        fenced(|| stale.renew("k", old_claim, Duration::from_secs(60))).await;
    }
    match newer.get("k").await.unwrap() {
        Some(Entry::Completed { response, .. }) => assert_eq!(response.body(), "newer"),
        other => panic!("the newer record was lost: {other:?}"),
    }
    // Through Sentinel, new keys go to the new primary.
    assert!(matches!(
        stale.begin("k-new", fp, Duration::from_secs(60)).await,
        Ok(Begin::Started(_))
    ));

    // Held to the demoted node's address: READONLY is a store error, not a claim (the first
    // call may meet the connection Sentinel closed; the next ones reach the demoted node).
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
    assert!(newer.get("k-fixed").await.unwrap().is_none());
}

/// A response stored while the replication stream is held back (two replicas, each behind a
/// paused proxy): the store's clients reach the primary through an address that follows the
/// promotion (a proxy re-pointed to the promoted replica, as a managed service's name is).
/// Returns what the promoted replica holds for the key once the owner is done: waiting, the
/// completion was not confirmed, the key stayed in flight, and the owner sent it again to the
/// new primary; not waiting, it was acknowledged, and lost.
async fn unconfirmed_completion(replicas: u32) -> Option<Entry> {
    let mut primary = Node::primary();
    let links = [
        Proxy::start(primary.port).await,
        Proxy::start(primary.port).await,
    ];
    let standby = [
        Node::replica_of(links[0].port),
        Node::replica_of(links[1].port),
    ];
    for replica in &standby {
        replicated(&primary, replica);
    }
    let front = Proxy::start(primary.port).await;
    let store = RedisStore::builder(&front.url())
        .wait_for_replicas(replicas)
        .replica_timeout(Duration::from_millis(300))
        .prefix("unconfirmed:")
        .connect()
        .await
        .unwrap();
    let fp = Fingerprint::of(&http::Method::POST, "/v1/send", b"x");
    let Begin::Started(claim) = store.begin("k", fp, Duration::from_secs(60)).await.unwrap() else {
        panic!("a fresh key is claimed");
    };
    // Both replicas have the claim (the control does not wait for it: it waits here).
    tokio::task::block_in_place(|| {
        wait_until("the claim on both replicas", LIMIT, || {
            standby.iter().all(|r| {
                r.query::<Option<Vec<u8>>>(redis::cmd("GET").arg("unconfirmed:k"))
                    .is_ok_and(|v| v.is_some())
            })
        })
    });
    for link in &links {
        link.pause();
    }
    let response = StoredResponse::new(StatusCode::OK, http::HeaderMap::new(), Bytes::from("sent"));
    let stored = store
        .complete("k", claim, fp, response.clone(), Duration::from_secs(60))
        .await;
    if replicas > 0 {
        let err = stored.expect_err("confirmed with the replicas held back");
        assert!(!err.is_fenced(), "{err}");
    } else {
        stored.expect("acknowledged by the primary alone");
    }

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

    if replicas > 0 {
        // The owner sends its completion again (the layer does so in the background while the
        // key stays in flight): the first call may meet the dead primary's connection.
        let start = std::time::Instant::now();
        while let Err(err) = store
            .complete("k", claim, fp, response.clone(), Duration::from_secs(60))
            .await
        {
            assert!(!err.is_fenced(), "{err}");
            assert!(start.elapsed() < LIMIT, "never confirmed: {err}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let look = RedisStore::builder(&standby[0].url())
        .wait_for_replicas(0)
        .prefix("unconfirmed:")
        .connect()
        .await
        .unwrap();
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
