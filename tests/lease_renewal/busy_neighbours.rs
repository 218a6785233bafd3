//! Lease renewal from any handler's poll and from a new claim: hundreds of claims on one
//! current-thread runtime, one layer on two runtimes, a released key's slot reused while a
//! neighbour renews, RedisStore renewals sent from short neighbours' tasks. Real sockets on
//! loopback, real clocks (the stores' leases are real time); only exact counts are asserted,
//! never how long something took. From the review of 2026-12-04.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::Layer;
use tower_idempotency_keys::{
    Begin, Entry, FencingToken, Fingerprint, IdempotencyLayer, IdempotencyStore, MemoryStore,
    StoreError, StoredResponse,
};

// =======================================================================================
// 1. Lease renewal
// =======================================================================================

const LEASE: Duration = Duration::from_millis(400);

use crate::support::runtime_server::{runtime, serve_on, Flavour, Server};
use crate::SERIAL;

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A store that counts what the layer asks of it, and which renewals it refused.
struct Counting<St> {
    inner: St,
    renewed: AtomicUsize,
    renew_refused: AtomicUsize,
    completed: AtomicUsize,
    released: AtomicUsize,
}

impl<St> Counting<St> {
    fn new(inner: St) -> Arc<Self> {
        Arc::new(Counting {
            inner,
            renewed: AtomicUsize::new(0),
            renew_refused: AtomicUsize::new(0),
            completed: AtomicUsize::new(0),
            released: AtomicUsize::new(0),
        })
    }
}

/// The layer takes a store by value: a shared handle on a counting one.
#[derive(Clone)]
struct Shared<St>(Arc<Counting<St>>);

impl<St: IdempotencyStore> IdempotencyStore for Shared<St> {
    fn begin(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send {
        self.0.inner.begin(key, fingerprint, lease)
    }

    fn renew(
        &self,
        key: &str,
        claim: FencingToken,
        lease: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let counting = self.0.clone();
        let call = self.0.inner.renew(key, claim, lease);
        async move {
            let r = call.await;
            match &r {
                Ok(()) => counting.renewed.fetch_add(1, Ordering::SeqCst),
                Err(_) => counting.renew_refused.fetch_add(1, Ordering::SeqCst),
            };
            r
        }
    }

    fn complete(
        &self,
        key: &str,
        claim: FencingToken,
        fingerprint: Fingerprint,
        response: StoredResponse,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.0.completed.fetch_add(1, Ordering::SeqCst);
        self.0
            .inner
            .complete(key, claim, fingerprint, response, ttl)
    }

    fn get(&self, key: &str) -> impl Future<Output = Result<Option<Entry>, StoreError>> + Send {
        self.0.inner.get(key)
    }

    fn release(
        &self,
        key: &str,
        claim: FencingToken,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.0.released.fetch_add(1, Ordering::SeqCst);
        self.0.inner.release(key, claim)
    }
}

/// What the handlers share with the test: runs per key, and the gates that hold them.
#[derive(Default)]
struct Lab {
    runs: Mutex<HashMap<String, u32>>,
    /// Keys whose handler answers 503 on its first run (a declined 5xx frees the key).
    fail_first: Mutex<Vec<String>>,
    /// While false, a handler works on in stretches of `stretch`, yielding between them.
    open: AtomicBool,
    /// Keys whose handler ends at once whatever `open` says.
    short: Mutex<Vec<String>>,
    started: AtomicUsize,
}

impl Lab {
    fn runs(&self, key: &str) -> u32 {
        self.runs.lock().unwrap().get(key).copied().unwrap_or(0)
    }
    fn total(&self) -> u32 {
        self.runs.lock().unwrap().values().sum()
    }
}

/// The handler: counts its run, then works without yielding for `stretch` at a time, yielding
/// between stretches, until the lab opens (or at once for a short key).
fn key_of<B>(req: &Request<B>) -> String {
    req.headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .trim_matches('"')
        .to_owned()
}

async fn handle(lab: Arc<Lab>, stretch: Duration, key: String) -> Response<Full<Bytes>> {
    let run = {
        let mut runs = lab.runs.lock().unwrap();
        let n = runs.entry(key.clone()).or_insert(0);
        *n += 1;
        *n
    };
    lab.started.fetch_add(1, Ordering::SeqCst);
    if run == 1 && lab.fail_first.lock().unwrap().contains(&key) {
        let mut res = Response::new(Full::new(Bytes::from_static(b"declined")));
        *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        return res;
    }
    let short = lab.short.lock().unwrap().contains(&key);
    if !short {
        while !lab.open.load(Ordering::SeqCst) {
            std::thread::sleep(stretch);
            tokio::task::yield_now().await;
        }
    }
    Response::new(Full::new(Bytes::from(format!("done {key}"))))
}

/// Serves the layer `make` returns (made on the server's runtime) over loopback from a
/// runtime of `flavour` on a thread of its own.
fn serve<St, F, Fut>(
    flavour: Flavour,
    lab: Arc<Lab>,
    stretch: Duration,
    make: F,
) -> (SocketAddr, Server)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = IdempotencyLayer<St>>,
    St: IdempotencyStore,
{
    serve_on(flavour, move || async move {
        let layer = make().await;
        layer.layer(tower::service_fn(move |req: Request<_>| {
            let lab = lab.clone();
            let key = key_of(&req);
            async move { Ok::<_, Infallible>(handle(lab, stretch, key).await) }
        }))
    })
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A keyed POST: its status and whether it was a replay.
async fn post(client: &HttpClient, addr: SocketAddr, key: &str) -> (StatusCode, bool) {
    let req = Request::post(format!("http://{addr}/v1/writes"))
        .header("idempotency-key", format!("\"{key}\""))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{\"a\":1}")))
        .unwrap();
    // A guard against a hang, not a measure: a busy server thread answers in seconds.
    let res = tokio::time::timeout(Duration::from_secs(300), client.request(req))
        .await
        .expect("the server answers within five minutes")
        .expect("a response");
    let status = res.status();
    let replayed = res.headers().get("idempotent-replayed").is_some();
    let _ = res.into_body().collect().await;
    (status, replayed)
}

/// Sends every key at once; the statuses in the keys' order.
async fn post_all(
    client: &HttpClient,
    addrs: &[SocketAddr],
    keys: &[String],
) -> Vec<(StatusCode, bool)> {
    let mut tasks = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let (client, key, addr) = (client.clone(), key.clone(), addrs[i % addrs.len()]);
        tasks.push(tokio::spawn(async move { post(&client, addr, &key).await }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

async fn wait_started(lab: &Lab, n: usize) {
    for _ in 0..6000 {
        if lab.started.load(Ordering::SeqCst) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "only {} of {n} handlers started",
        lab.started.load(Ordering::SeqCst)
    );
}

/// How many of `answers` (status, replayed) are 409s.
fn conflicts(answers: &[(StatusCode, bool)]) -> usize {
    answers
        .iter()
        .filter(|(s, _)| *s == StatusCode::CONFLICT)
        .count()
}

/// How many of `answers` are a fresh 200 (the handler's own, not a replay).
fn fresh(answers: &[(StatusCode, bool)]) -> usize {
    answers
        .iter()
        .filter(|(s, r)| *s == StatusCode::OK && !r)
        .count()
}

/// How many of `answers` are a replayed 200.
fn replays(answers: &[(StatusCode, bool)]) -> usize {
    answers
        .iter()
        .filter(|(s, r)| *s == StatusCode::OK && *r)
        .count()
}

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:04}")).collect()
}

/// Two hundred claims on one current-thread runtime, each handler busy in 2 ms stretches (a
/// round of every handler is then ~0.4 s, a whole lease, so no claim survives on its own
/// handler's polls alone): held over 4 leases, each key runs once, every repeat during its
/// handler gets 409 (twice: at once and after 4 leases), after it a replay; the store refuses
/// no renewal (none is sent for a claim whose outcome is stored, on one thread).
///
/// Found by the review of 2026-12-04.
#[test]
fn two_hundred_claims_on_one_thread_each_run_once() {
    let _s = serial();
    let lab = Arc::new(Lab::default());
    let store = Counting::new(MemoryStore::new());
    let shared = Shared(store.clone());
    let (addr, server) = serve(
        Flavour::CurrentThread,
        lab.clone(),
        Duration::from_millis(2),
        move || async move { IdempotencyLayer::new(shared).lease(LEASE) },
    );
    let ks = keys("many", 200);
    let rt = runtime(Flavour::MultiThread);
    rt.block_on(async {
        let client = client();
        let firsts = {
            let (client, ks) = (client.clone(), ks.clone());
            tokio::spawn(async move { post_all(&client, &[addr], &ks).await })
        };
        wait_started(&lab, 200).await;
        let during = post_all(&client, &[addr], &ks).await;
        assert_eq!(conflicts(&during), 200, "{during:?}");
        tokio::time::sleep(LEASE * 4).await;
        let later = post_all(&client, &[addr], &ks).await;
        assert_eq!(conflicts(&later), 200, "{later:?}");
        assert_eq!(lab.total(), 200);
        lab.open.store(true, Ordering::SeqCst);
        let firsts = firsts.await.unwrap();
        assert_eq!(fresh(&firsts), 200);
        let after = post_all(&client, &[addr], &ks).await;
        assert_eq!(replays(&after), 200, "{after:?}");
    });
    drop(server);
    for k in &ks {
        assert_eq!(lab.runs(k), 1, "{k}");
    }
    assert_eq!(store.completed.load(Ordering::SeqCst), 200);
    assert_eq!(store.released.load(Ordering::SeqCst), 0);
    assert_eq!(store.renew_refused.load(Ordering::SeqCst), 0);
    // 200 claims held 4+ leases: renewed at least 4 times each (once per quarter lease).
    assert!(
        store.renewed.load(Ordering::SeqCst) >= 200 * 4 * 3,
        "{}",
        store.renewed.load(Ordering::SeqCst)
    );
}

/// One layer (one store, one `Renewals`) served from a multi-thread and a current-thread
/// runtime at once: 40 keys, half claimed on each; each key's repeats go to the other runtime.
/// Each key runs once; every repeat during gets 409, after 4 leases too; after, a replay.
///
/// Found by the review of 2026-12-04.
#[test]
fn one_layer_on_two_runtimes_each_key_once() {
    let _s = serial();
    let lab = Arc::new(Lab::default());
    let store = Counting::new(MemoryStore::new());
    let layer = IdempotencyLayer::new(Shared(store.clone())).lease(LEASE);
    let (l1, l2) = (layer.clone(), layer);
    let (a, sa) = serve(
        Flavour::MultiThread,
        lab.clone(),
        Duration::from_millis(30),
        move || async move { l1 },
    );
    let (b, sb) = serve(
        Flavour::CurrentThread,
        lab.clone(),
        Duration::from_millis(30),
        move || async move { l2 },
    );
    let ks = keys("two-rt", 40);
    let rt = runtime(Flavour::MultiThread);
    rt.block_on(async {
        let client = client();
        let firsts = {
            let (client, ks) = (client.clone(), ks.clone());
            tokio::spawn(async move { post_all(&client, &[a, b], &ks).await })
        };
        wait_started(&lab, 40).await;
        let during = post_all(&client, &[b, a], &ks).await;
        assert_eq!(conflicts(&during), 40, "{during:?}");
        tokio::time::sleep(LEASE * 4).await;
        let later = post_all(&client, &[b, a], &ks).await;
        assert_eq!(conflicts(&later), 40, "{later:?}");
        lab.open.store(true, Ordering::SeqCst);
        let firsts = firsts.await.unwrap();
        assert_eq!(fresh(&firsts), 40);
        let after = post_all(&client, &[b, a], &ks).await;
        assert_eq!(replays(&after), 40, "{after:?}");
    });
    drop((sa, sb));
    for k in &ks {
        assert_eq!(lab.runs(k), 1, "{k}");
    }
    assert_eq!(store.completed.load(Ordering::SeqCst), 40);
    assert_eq!(store.released.load(Ordering::SeqCst), 0);
}

/// A key whose first run answers a declined 503 (`store_server_errors(false)`: the key is
/// released), then claimed again by its repeat while 20 neighbours stay busy on the same
/// current-thread runtime renewing every due slot (the released claim's slot and heap entry
/// are reused by later claims). The re-claimed key runs exactly twice in all (the declined run
/// and one more), its repeats during the second run get 409 (also after 4 leases); the
/// neighbours run once each; the released claim's stale renewal is never accepted.
///
/// Found by the review of 2026-12-04.
#[test]
fn a_released_key_reclaimed_while_neighbours_renew_runs_once_more() {
    let _s = serial();
    let lab = Arc::new(Lab::default());
    let reused = keys("reused", 5);
    lab.fail_first
        .lock()
        .unwrap()
        .extend(reused.iter().cloned());
    let store = Counting::new(MemoryStore::new());
    let shared = Shared(store.clone());
    let (addr, server) = serve(
        Flavour::CurrentThread,
        lab.clone(),
        Duration::from_millis(5),
        move || async move {
            IdempotencyLayer::new(shared)
                .lease(LEASE)
                .store_server_errors(false)
        },
    );
    let neighbours = keys("neighbour", 20);
    let rt = runtime(Flavour::MultiThread);
    rt.block_on(async {
        let client = client();
        let n_firsts = {
            let (client, ks) = (client.clone(), neighbours.clone());
            tokio::spawn(async move { post_all(&client, &[addr], &ks).await })
        };
        wait_started(&lab, 20).await;
        // Past a quarter lease: the neighbours' entries are due and renewed by each other.
        tokio::time::sleep(LEASE / 2).await;
        let declined = post_all(&client, &[addr], &reused).await;
        assert_eq!(
            declined
                .iter()
                .filter(|(s, _)| *s == StatusCode::SERVICE_UNAVAILABLE)
                .count(),
            5,
            "{declined:?}"
        );
        assert_eq!(store.released.load(Ordering::SeqCst), 5);
        let seconds = {
            let (client, ks) = (client.clone(), reused.clone());
            tokio::spawn(async move { post_all(&client, &[addr], &ks).await })
        };
        wait_started(&lab, 30).await;
        let during = post_all(&client, &[addr], &reused).await;
        assert_eq!(conflicts(&during), 5, "{during:?}");
        tokio::time::sleep(LEASE * 4).await;
        let later = post_all(&client, &[addr], &reused).await;
        assert_eq!(conflicts(&later), 5, "{later:?}");
        let later_n = post_all(&client, &[addr], &neighbours).await;
        assert_eq!(conflicts(&later_n), 20, "{later_n:?}");
        lab.open.store(true, Ordering::SeqCst);
        let seconds = seconds.await.unwrap();
        assert_eq!(fresh(&seconds), 5);
        let n_firsts = n_firsts.await.unwrap();
        assert_eq!(fresh(&n_firsts), 20);
    });
    drop(server);
    for k in &reused {
        assert_eq!(lab.runs(k), 2, "{k}");
    }
    for k in &neighbours {
        assert_eq!(lab.runs(k), 1, "{k}");
    }
    assert_eq!(store.completed.load(Ordering::SeqCst), 25);
    assert_eq!(store.released.load(Ordering::SeqCst), 5);
    assert_eq!(store.renew_refused.load(Ordering::SeqCst), 0);
}

mod redis_renewal {
    use super::*;
    use crate::support::redis::TestRedis;
    use tower_idempotency_keys::RedisStore;

    /// This test's time unit. Redis keeps a lease in its own real time, so no paused clock can
    /// stand in for it: each renewal must reach Redis within a lease of the one before. On the
    /// server's one thread, shared with ten busy handlers and redis-rs's connection task, a
    /// renewal goes out up to a third of a lease after the last (a quarter and a tick) plus a
    /// stretch for the task that sends it and one for the connection task that writes it. With
    /// the 400 ms lease and 20 ms stretches this test once had, that left about 200 ms for
    /// everything else on the machine: one stall of the server thread or of redis-server that
    /// long (three builds beside it on two cores) and a claim lapsed, its repeat ran the handler
    /// a second time, and the test failed. The timeline was then made five times as long (lease
    /// 2 s, stretches 100 ms, the store's response timeout 5 s, the waits counted in leases),
    /// and it failed again with three builds beside it: ten busy handlers make a round of the
    /// thread 1 s, so a renewal could go out 0.5 s + two rounds after the last, and a second
    /// of stall lapsed a claim (whose repeat then ran the long handler again, seen as a post
    /// that never answered). Now four long handlers (a round of 0.4 s) and a 4 s lease: a
    /// renewal reaches Redis at most about 1.3 s after the last, and the thread has to stall
    /// for over 2.5 s for a claim to lapse. The same shape and the same assertions, per key.
    const LEASE: Duration = Duration::from_secs(4);
    /// Long claims: each is one busy handler on the server's one thread.
    const LONG: usize = 4;
    const STRETCH: Duration = Duration::from_millis(100);
    /// `RedisStore::connect`'s 1 s, scaled with the rest: a reply waits for a round of the busy
    /// handlers (1 s here) before redis-rs's connection task reads it.
    const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

    /// RedisStore on a current-thread runtime: 4 long claims (handlers busy in stretches of
    /// 0.025 lease) while 60 short keyed requests come and go; the short handlers' tasks renew
    /// the long claims (the renewal's reply is awaited from a task spawned from theirs) and
    /// end. Each key runs once; the long keys' repeats get 409 at once and after 3 leases;
    /// after, replays. The keys are deleted when the test ends, passed or failed.
    ///
    /// Found by the review of 2026-12-04.
    #[test]
    fn redis_renewals_from_short_neighbours_keep_long_claims() {
        let _s = serial();
        // Dropped last: deletes every key under the test's prefix, also when an assert fails.
        let redis = TestRedis::start("renewals-from-short-neighbours");
        let lab = Arc::new(Lab::default());
        let long = keys("long", LONG);
        let short = keys("short", 60);
        lab.short.lock().unwrap().extend(short.iter().cloned());
        let (url, p) = (redis.url().to_owned(), redis.prefix().to_owned());
        let (addr, server) = serve(
            Flavour::CurrentThread,
            lab.clone(),
            STRETCH,
            move || async move {
                let store = RedisStore::connect_with(&url, RESPONSE_TIMEOUT)
                    .await
                    .expect("the test's Redis")
                    .prefix(p);
                IdempotencyLayer::new(store).lease(LEASE)
            },
        );
        let rt = runtime(Flavour::MultiThread);
        rt.block_on(async {
            let client = client();
            let firsts = {
                let (client, ks) = (client.clone(), long.clone());
                tokio::spawn(async move { post_all(&client, &[addr], &ks).await })
            };
            wait_started(&lab, LONG).await;
            let during = post_all(&client, &[addr], &long).await;
            assert_eq!(conflicts(&during), LONG, "{during:?}");
            // Short requests in waves over 3 leases.
            for wave in short.chunks(10) {
                let done = post_all(&client, &[addr], wave).await;
                assert_eq!(fresh(&done), 10, "{done:?}");
                tokio::time::sleep(LEASE / 2).await;
            }
            let later = post_all(&client, &[addr], &long).await;
            assert_eq!(conflicts(&later), LONG, "{later:?}");
            lab.open.store(true, Ordering::SeqCst);
            let firsts = firsts.await.unwrap();
            assert_eq!(fresh(&firsts), LONG);
            let after = post_all(&client, &[addr], &long).await;
            assert_eq!(replays(&after), LONG, "{after:?}");
        });
        drop(server);
        for k in long.iter().chain(short.iter()) {
            assert_eq!(lab.runs(k), 1, "{k}");
        }
    }
}
