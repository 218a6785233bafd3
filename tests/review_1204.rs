//! Review of 2026-12-04 (branch wt-review1204): the changes of the day, attacked.
//!
//! 1. Lease renewal from any handler's poll and from a new claim (`src/server/renewal`):
//!    hundreds of claims on one current-thread runtime, one layer on two runtimes, a released
//!    key's slot reused while a neighbour renews, RedisStore renewals sent from short
//!    neighbours' tasks. Real sockets on loopback, real clocks (the stores' leases are real
//!    time); only exact counts are asserted, never how long something took.
//! 2. `classify_parts`: a keyed read keeps verdict source `Method`; nothing that is a write by
//!    marker or route is now retried or hedged.
//! 3. `Head`: a retry's and a hedge's copy carry the first attempt's method (an extension
//!    method), URI with query, version, multi-valued headers and extensions; per-attempt
//!    headers are set, not accumulated.
//! 4. `deadline_at`: `Duration::MAX` and other huge deadlines, a zero deadline, the deadline
//!    absolute across retries and body resumes, `grpc-timeout` with a policy deadline. Paused
//!    time.
//!
//! One defect, fixed (its three tests failed before and run): a per-attempt timeout of
//! `Duration::MAX` (policy or request options) panicked when `ReadWholeLayer` /
//! `ReadWholeMiddleware` read the body (`FrameClock::end` added it to the clock); a per-frame
//! wait too long to be a time is now no per-frame limit. Every other attack held.

mod support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_retry_safety::server::{
    Begin, Claim, Entry, Fingerprint, IdempotencyLayer, IdempotencyStore, MemoryStore, StoreError,
    StoredResponse,
};
use tower_retry_safety::{Hedge, Idempotency, RequestOptions, RetryPolicy, RetryPolicyBuilder};

// =======================================================================================
// 1. Lease renewal
// =======================================================================================

const LEASE: Duration = Duration::from_millis(400);

/// The renewal tests time real work against real leases: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

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
        claim: Claim,
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
        claim: Claim,
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
        claim: Claim,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.0.released.fetch_add(1, Ordering::SeqCst);
        self.0.inner.release(key, claim)
    }
}

#[derive(Clone, Copy, Debug)]
enum Flavour {
    CurrentThread,
    MultiThread,
}

fn runtime(flavour: Flavour) -> tokio::runtime::Runtime {
    match flavour {
        Flavour::CurrentThread => tokio::runtime::Builder::new_current_thread(),
        Flavour::MultiThread => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(2);
            b
        }
    }
    .enable_all()
    .build()
    .expect("runtime")
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

struct Server {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
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
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("addr");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        runtime(flavour).block_on(async move {
            let layer = make().await;
            let svc = layer.layer(tower::service_fn(move |req: Request<_>| {
                let lab = lab.clone();
                let key = key_of(&req);
                async move { Ok::<_, Infallible>(handle(lab, stretch, key).await) }
            }));
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            let accept = async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        return;
                    };
                    let svc = svc.clone();
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(
                            move |req: Request<hyper::body::Incoming>| {
                                tower::ServiceExt::oneshot(svc.clone(), req)
                            },
                        );
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
            };
            tokio::select! {
                _ = accept => {}
                _ = stop_rx => {}
            }
        });
    });
    (
        addr,
        Server {
            stop: Some(stop_tx),
            thread: Some(thread),
        },
    )
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
    let res = tokio::time::timeout(Duration::from_secs(60), client.request(req))
        .await
        .expect("the server answers within a minute")
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

#[cfg(feature = "redis")]
mod redis_renewal {
    use super::*;
    use tower_retry_safety::server::RedisStore;

    fn url() -> String {
        std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
    }

    fn clean(prefix: &str) {
        let client = redis::Client::open(url()).expect("a Redis URL");
        let mut conn = client.get_connection().expect("Redis answers");
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query(&mut conn)
            .expect("KEYS");
        if !keys.is_empty() {
            let _: () = redis::cmd("DEL").arg(keys).query(&mut conn).expect("DEL");
        }
    }

    /// RedisStore on a current-thread runtime: 10 long claims (handlers busy in 20 ms
    /// stretches, 0.05 lease) while 60 short keyed requests come and go; the short handlers'
    /// tasks renew the long claims (the renewal's reply is awaited from a task spawned from
    /// theirs) and end. Each key runs once; the long keys' repeats get 409 at once and after 4
    /// leases; after, replays.
    #[test]
    fn redis_renewals_from_short_neighbours_keep_long_claims() {
        let _s = serial();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let prefix = format!("trs-review1204-{}-{nanos}:", std::process::id());
        let lab = Arc::new(Lab::default());
        let long = keys("long", 10);
        let short = keys("short", 60);
        lab.short.lock().unwrap().extend(short.iter().cloned());
        let (url, p) = (url(), prefix.clone());
        let (addr, server) = serve(
            Flavour::CurrentThread,
            lab.clone(),
            Duration::from_millis(20),
            move || async move {
                let store = RedisStore::connect(&url)
                    .await
                    .expect("Redis on 127.0.0.1:6379")
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
            wait_started(&lab, 10).await;
            let during = post_all(&client, &[addr], &long).await;
            assert_eq!(conflicts(&during), 10, "{during:?}");
            // Short requests in waves over 4 leases.
            for wave in short.chunks(10) {
                let done = post_all(&client, &[addr], wave).await;
                assert_eq!(fresh(&done), 10, "{done:?}");
                tokio::time::sleep(LEASE / 2).await;
            }
            let later = post_all(&client, &[addr], &long).await;
            assert_eq!(conflicts(&later), 10, "{later:?}");
            lab.open.store(true, Ordering::SeqCst);
            let firsts = firsts.await.unwrap();
            assert_eq!(fresh(&firsts), 10);
            let after = post_all(&client, &[addr], &long).await;
            assert_eq!(replays(&after), 10, "{after:?}");
        });
        drop(server);
        clean(&prefix);
        for k in long.iter().chain(short.iter()) {
            assert_eq!(lab.runs(k), 1, "{k}");
        }
    }
}

// =======================================================================================
// Client side: a recording inner service (no server: the layer's own decisions), paused time
// =======================================================================================

/// A caller's extension, to see it on every attempt.
#[derive(Clone, Debug, PartialEq)]
struct Tag(&'static str);

#[derive(Debug)]
struct Seen {
    at: Duration,
    method: Method,
    uri: Uri,
    version: Version,
    headers: HeaderMap,
    tag: Option<Tag>,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// The n-th call (from 0) waits `plan[n].0` ms and answers status `plan[n].1` (the last one
/// repeats); a status of 1014 answers 200 with `grpc-status: 14`.
fn recording(
    plan: &'static [(u64, u16)],
) -> (
    impl tower::Service<
            Request<String>,
            Response = Response<String>,
            Error = Infallible,
            Future = impl Send,
        > + Clone,
    Log,
) {
    let log: Log = Arc::default();
    let seen = log.clone();
    let t0 = Instant::now();
    let svc = tower::service_fn(move |req: Request<String>| {
        let n = {
            let mut log = seen.lock().unwrap();
            log.push(Seen {
                at: t0.elapsed(),
                method: req.method().clone(),
                uri: req.uri().clone(),
                version: req.version(),
                headers: req.headers().clone(),
                tag: req.extensions().get::<Tag>().cloned(),
            });
            log.len() - 1
        };
        let (delay, status) = plan[n.min(plan.len() - 1)];
        async move {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            let mut res = Response::new(String::from("ok"));
            if status == 1014 {
                res.headers_mut()
                    .insert("content-type", HeaderValue::from_static("application/grpc"));
                res.headers_mut()
                    .insert("grpc-status", HeaderValue::from_static("14"));
            } else {
                *res.status_mut() = StatusCode::from_u16(status).unwrap();
            }
            Ok::<_, Infallible>(res)
        }
    });
    (svc, log)
}

fn base() -> RetryPolicyBuilder {
    RetryPolicy::builder()
        .jitter(false)
        .backoff(Duration::from_millis(100), Duration::from_secs(1))
        .max_retries(5)
        .no_budget()
        .attempt_header(Some(http::HeaderName::from_static("x-attempt")))
}

fn calls(log: &Log) -> usize {
    log.lock().unwrap().len()
}

fn without(headers: &HeaderMap, names: &[&str]) -> HeaderMap {
    let mut h = headers.clone();
    for n in names {
        h.remove(*n);
    }
    h
}

fn values(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

/// A WebDAV request with everything a copy could lose.
fn dav_request() -> Request<String> {
    let mut req = Request::builder()
        .method(Method::from_bytes(b"PROPFIND").unwrap())
        .uri("http://api.test/dav/a%20b/?depth=1&x=2&x=3")
        .version(Version::HTTP_2)
        .header("accept", "application/xml")
        .header("accept", "text/plain")
        .header("x-multi", "1")
        .header("x-multi", "2")
        .header("x-multi", "3")
        .header("depth", "1")
        .body(String::from("<propfind/>"))
        .unwrap();
    req.extensions_mut().insert(Tag("caller"));
    req.extensions_mut().insert(Idempotency::Idempotent);
    req
}

fn assert_same_head(seen: &[Seen], extra: &[&str]) {
    let first = &seen[0];
    let mut strip = vec!["x-attempt"];
    strip.extend_from_slice(extra);
    for (i, s) in seen.iter().enumerate() {
        assert_eq!(s.method.as_str(), "PROPFIND", "attempt {}", i + 1);
        assert_eq!(
            s.uri,
            "http://api.test/dav/a%20b/?depth=1&x=2&x=3",
            "attempt {}",
            i + 1
        );
        assert_eq!(s.version, Version::HTTP_2, "attempt {}", i + 1);
        assert_eq!(s.tag, Some(Tag("caller")), "attempt {}", i + 1);
        assert_eq!(
            without(&s.headers, &strip),
            without(&first.headers, &strip),
            "attempt {}",
            i + 1
        );
        assert_eq!(
            values(&s.headers, "accept"),
            ["application/xml", "text/plain"]
        );
        assert_eq!(values(&s.headers, "x-multi"), ["1", "2", "3"]);
        assert_eq!(
            values(&s.headers, "x-attempt"),
            [format!("{}", i + 1)],
            "attempt {}",
            i + 1
        );
    }
}

/// Retries of an extension method (marked idempotent) carry the first attempt's method, URI
/// with its query, HTTP/2, multi-valued headers and the caller's extension; the attempt header
/// is one value per attempt. Exactly 3 calls (503, 503, 200).
#[tokio::test(start_paused = true)]
async fn retries_copy_the_whole_head_of_an_extension_method() {
    let (svc, log) = recording(&[(0, 503), (0, 503), (0, 200)]);
    let res = base()
        .build()
        .unwrap()
        .layer(svc)
        .oneshot(dav_request())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let seen = log.lock().unwrap();
    assert_eq!(seen.len(), 3);
    assert_same_head(&seen, &[]);
}

/// A hedge carries the same head as the attempt it hedges: 2 calls, the hedge 50 ms after.
#[tokio::test(start_paused = true)]
async fn a_hedge_copies_the_whole_head_of_an_extension_method() {
    let (svc, log) = recording(&[(10_000, 200), (0, 200)]);
    let policy = base()
        .hedge(Hedge::fixed(Duration::from_millis(50)).max_extra_load(1.0))
        .build()
        .unwrap();
    let res = policy.layer(svc).oneshot(dav_request()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let seen = log.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].at, Duration::from_millis(50));
    assert_same_head(&seen, &[]);
}

#[cfg(feature = "tonic")]
fn grpc_timeout(value: &str) -> Duration {
    let (digits, unit) = value.split_at(value.len() - 1);
    let n: u64 = digits.parse().unwrap();
    match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => panic!("unit {unit}"),
    }
}

#[cfg(feature = "tonic")]
fn grpc_request(timeout: Option<&'static str>) -> Request<String> {
    let mut b = Request::post("http://api.test/pkg.Svc/Read")
        .version(Version::HTTP_2)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("x-multi", "1")
        .header("x-multi", "2");
    if let Some(t) = timeout {
        b = b.header("grpc-timeout", t);
    }
    let mut req = b.body(String::new()).unwrap();
    req.extensions_mut().insert(Idempotency::Idempotent);
    req
}

/// A gRPC call with `grpc-timeout: 300m` and a policy deadline of 1 s: the deadline is 300 ms
/// from the first attempt, absolute: UNAVAILABLE at 100 ms, a retry at 150 ms carrying
/// `grpc-timeout` 150 ms and one `grpc-previous-rpc-attempts: 1`; the third would wait past
/// the deadline. Exactly 2 calls; one value of each per-attempt header.
#[cfg(feature = "tonic")]
#[tokio::test(start_paused = true)]
async fn grpc_headers_are_set_per_attempt_against_an_absolute_deadline() {
    let (svc, log) = recording(&[(100, 1014)]);
    let policy = base()
        .backoff(Duration::from_millis(50), Duration::from_secs(1))
        .deadline(Duration::from_secs(1))
        .build()
        .unwrap();
    let res = policy
        .layer(svc)
        .oneshot(grpc_request(Some("300m")))
        .await
        .unwrap();
    assert_eq!(res.headers()["grpc-status"], "14");
    let seen = log.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].at, Duration::from_millis(150));
    for (i, s) in seen.iter().enumerate() {
        assert_eq!(
            values(&s.headers, "grpc-timeout").len(),
            1,
            "attempt {}",
            i + 1
        );
        assert_eq!(values(&s.headers, "x-attempt"), [format!("{}", i + 1)]);
        assert_eq!(values(&s.headers, "x-multi"), ["1", "2"]);
        assert_eq!(s.version, Version::HTTP_2);
        assert_eq!(s.uri, "http://api.test/pkg.Svc/Read");
    }
    assert_eq!(
        grpc_timeout(&values(&seen[0].headers, "grpc-timeout")[0]),
        Duration::from_millis(300)
    );
    assert_eq!(
        grpc_timeout(&values(&seen[1].headers, "grpc-timeout")[0]),
        Duration::from_millis(150)
    );
    assert!(seen[0].headers.get("grpc-previous-rpc-attempts").is_none());
    assert_eq!(
        values(&seen[1].headers, "grpc-previous-rpc-attempts"),
        ["1"]
    );
}

/// `grpc-timeout: 300m` with a policy deadline of `Duration::MAX`: the call's own timeout
/// bounds it (cut at exactly 300 ms, 1 call, an error), no panic.
#[cfg(feature = "tonic")]
#[tokio::test(start_paused = true)]
async fn grpc_timeout_bounds_a_call_whose_policy_deadline_is_duration_max() {
    let (svc, log) = recording(&[(10_000, 200)]);
    let policy = base().deadline(Duration::MAX).build().unwrap();
    let start = Instant::now();
    let err = policy
        .layer(svc)
        .oneshot(grpc_request(Some("300m")))
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    assert_eq!(calls(&log), 1);
    drop(err);
}

/// A huge `grpc-timeout` (99999999 hours, ~11,400 years: still a time) under a `Duration::MAX`
/// policy deadline: no panic; each attempt carries one `grpc-timeout` no larger than the
/// caller's; 3 calls (UNAVAILABLE twice, then 200).
#[cfg(feature = "tonic")]
#[tokio::test(start_paused = true)]
async fn a_huge_grpc_timeout_with_a_duration_max_deadline_does_not_panic() {
    let (svc, log) = recording(&[(0, 1014), (0, 1014), (0, 200)]);
    let policy = base().deadline(Duration::MAX).build().unwrap();
    let res = policy
        .layer(svc)
        .oneshot(grpc_request(Some("99999999H")))
        .await
        .unwrap();
    assert!(res.headers().get("grpc-status").is_none());
    let seen = log.lock().unwrap();
    assert_eq!(seen.len(), 3);
    for s in seen.iter() {
        let t = values(&s.headers, "grpc-timeout");
        assert_eq!(t.len(), 1);
        assert!(grpc_timeout(&t[0]) <= Duration::from_secs(99_999_999 * 3600));
    }
}

// ---------------------------------------------------------------------------------------
// 4. deadline_at
// ---------------------------------------------------------------------------------------

fn slow_post() -> Request<String> {
    Request::put("http://api.test/v1/things/1")
        .body(String::from("{}"))
        .unwrap()
}

/// `deadline(Duration::MAX)` in the policy is no deadline: a 100 s attempt is not cut, and
/// 503, 503, 200 is retried to the 200. No panic anywhere.
#[tokio::test(start_paused = true)]
async fn a_duration_max_policy_deadline_is_no_deadline() {
    let policy = base().deadline(Duration::MAX).build().unwrap();
    let (svc, log) = recording(&[(100_000, 200)]);
    let start = Instant::now();
    let res = policy
        .clone()
        .layer(svc)
        .oneshot(slow_post())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_secs(100));
    assert_eq!(calls(&log), 1);

    let (svc, log) = recording(&[(0, 503), (0, 503), (0, 200)]);
    let res = policy.layer(svc).oneshot(slow_post()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(calls(&log), 3);
}

/// Per-request `deadline(Duration::MAX)` and `attempt_timeout(Duration::MAX)` override a policy
/// deadline of 1 s: a 5 s attempt is not cut (1 call, 200).
#[tokio::test(start_paused = true)]
async fn a_duration_max_request_deadline_overrides_the_policy_one() {
    let policy = base().deadline(Duration::from_secs(1)).build().unwrap();
    let (svc, log) = recording(&[(5_000, 200)]);
    let mut req = slow_post();
    req.extensions_mut().insert(
        RequestOptions::new()
            .deadline(Duration::MAX)
            .attempt_timeout(Duration::MAX),
    );
    let start = Instant::now();
    let res = policy.layer(svc).oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert_eq!(calls(&log), 1);
}

/// A deadline huge but still a time (u64::MAX / 4 seconds, addable to now): no panic, the
/// retries run (3 calls), a slow attempt is not cut.
#[tokio::test(start_paused = true)]
async fn a_huge_but_addable_deadline_does_not_panic() {
    let huge = Duration::from_secs(u64::MAX / 4);
    let policy = base().deadline(huge).attempt_timeout(huge).build().unwrap();
    let (svc, log) = recording(&[(0, 503), (2_000, 503), (0, 200)]);
    let start = Instant::now();
    let res = policy.layer(svc).oneshot(slow_post()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(calls(&log), 3);
    // 2 s of attempt and backoffs of 100 and 200 ms.
    assert_eq!(start.elapsed(), Duration::from_millis(2_300));
}

/// A zero deadline: refused by the builder (`deadline`), and per request (where nothing refuses
/// it) the first attempt is sent (1 call), a slow one is cut at once with an error, and a 503
/// is not retried (1 call).
#[tokio::test(start_paused = true)]
async fn a_zero_deadline_sends_once_and_never_retries() {
    let err = base().deadline(Duration::ZERO).build().unwrap_err();
    assert_eq!(err.setting_name(), "deadline");
    let policy = base().build().unwrap();
    let zero = || RequestOptions::new().deadline(Duration::ZERO);
    let (svc, log) = recording(&[(1_000, 200)]);
    let mut req = slow_post();
    req.extensions_mut().insert(zero());
    let start = Instant::now();
    assert!(policy.clone().layer(svc).oneshot(req).await.is_err());
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(calls(&log), 1);

    let (svc, log) = recording(&[(0, 503), (0, 200)]);
    let mut req = slow_post();
    req.extensions_mut().insert(zero());
    let res = policy.layer(svc).oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(calls(&log), 1);
}

/// The deadline is absolute from the first attempt across retries: 1 s, attempts of 300 ms
/// answering 503, backoff 100 ms: attempts at 0, 400 and 800 ms, the third cut at exactly
/// 1000 ms. 3 calls, an error.
#[tokio::test(start_paused = true)]
async fn the_deadline_is_absolute_across_retries() {
    let policy = base()
        .backoff(Duration::from_millis(100), Duration::from_millis(100))
        .deadline(Duration::from_secs(1))
        .build()
        .unwrap();
    let (svc, log) = recording(&[(300, 503)]);
    let start = Instant::now();
    assert!(policy.layer(svc).oneshot(slow_post()).await.is_err());
    assert_eq!(start.elapsed(), Duration::from_millis(1_000));
    let seen = log.lock().unwrap();
    let at: Vec<_> = seen.iter().map(|s| s.at).collect();
    assert_eq!(
        at,
        [
            Duration::ZERO,
            Duration::from_millis(400),
            Duration::from_millis(800)
        ]
    );
}

// ---------------------------------------------------------------------------------------
// 2. classify_parts: keyed reads keep the method's verdict; keyed writes by marker/route
// ---------------------------------------------------------------------------------------

fn keyed(method: Method, uri: &str) -> Request<String> {
    Request::builder()
        .method(method)
        .uri(uri)
        .header("idempotency-key", "\"k-1204\"")
        .body(String::from("{}"))
        .unwrap()
}

fn hedging() -> RetryPolicyBuilder {
    base().hedge(Hedge::fixed(Duration::from_millis(50)).max_extra_load(1.0))
}

/// A keyed GET (trusted) keeps source Method and is hedged: 2 calls. A keyed POST is
/// IdempotencyKey and not hedged without `keyed_writes`: 1 call.
#[tokio::test(start_paused = true)]
async fn a_keyed_read_is_hedged_a_keyed_write_is_not() {
    use tower_retry_safety::VerdictSource;
    let policy = hedging().honor_idempotency_key(true).build().unwrap();
    let get = keyed(Method::GET, "http://api.test/v1/things/1");
    let v = policy.classify(&get);
    assert_eq!(
        (v.source(), v.idempotency(), v.is_keyed()),
        (VerdictSource::Method, Idempotency::Idempotent, true)
    );
    let (svc, log) = recording(&[(10_000, 200), (0, 200)]);
    policy.clone().layer(svc).oneshot(get).await.unwrap();
    assert_eq!(calls(&log), 2);

    let post = keyed(Method::POST, "http://api.test/v1/things");
    let v = policy.classify(&post);
    assert_eq!(
        (v.source(), v.idempotency(), v.is_keyed()),
        (VerdictSource::IdempotencyKey, Idempotency::Idempotent, true)
    );
    let (svc, log) = recording(&[(10_000, 200), (0, 200)]);
    policy.layer(svc).oneshot(post).await.unwrap();
    assert_eq!(calls(&log), 1);
}

/// Unscoped trust yields to a marker or route that calls a PUT/DELETE a write: with a key,
/// such a request is neither retried after a 503 nor hedged. 1 call each.
#[tokio::test(start_paused = true)]
async fn keyed_put_and_delete_called_writes_are_not_resent() {
    let policy = hedging()
        .honor_idempotency_key(true)
        .route(Method::PUT, "/v1/counters/{id}", Idempotency::NonIdempotent)
        .build()
        .unwrap();
    let put = keyed(Method::PUT, "http://api.test/v1/counters/7");
    assert!(!policy.classify(&put).is_keyed());
    let (svc, log) = recording(&[(1_000, 503), (0, 200)]);
    let res = policy.clone().layer(svc).oneshot(put).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(calls(&log), 1);

    let mut delete = keyed(Method::DELETE, "http://api.test/v1/queue/head");
    delete.extensions_mut().insert(Idempotency::NonIdempotent);
    assert!(!policy.classify(&delete).is_keyed());
    let (svc, log) = recording(&[(1_000, 503), (0, 200)]);
    let res = policy.layer(svc).oneshot(delete).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(calls(&log), 1);
}

/// A PUT a route calls a write, keyed, its host trusted: retried after a 503 (the key makes it
/// safe) but never hedged (not idempotent of itself, `keyed_writes` off): 2 calls, the second
/// after the first answered and the backoff (1100 ms), not at the hedge delay.
#[tokio::test(start_paused = true)]
async fn a_keyed_put_called_a_write_on_a_trusted_host_is_retried_not_hedged() {
    let policy = hedging()
        .honor_idempotency_key_for_host("api.test")
        .route(Method::PUT, "/v1/counters/{id}", Idempotency::NonIdempotent)
        .build()
        .unwrap();
    let put = keyed(Method::PUT, "http://api.test/v1/counters/7");
    assert!(policy.classify(&put).is_keyed());
    let (svc, log) = recording(&[(1_000, 503), (0, 200)]);
    let res = policy.layer(svc).oneshot(put).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let seen = log.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].at, Duration::from_millis(1_100));
}

/// A keyed GET to a host whose keys are not trusted (trust is for another host) is not keyed:
/// a 409 is final (1 call). To the trusted host, the 409 (still in flight) is retried: 2 calls.
#[tokio::test(start_paused = true)]
async fn a_keyed_get_to_an_untrusted_host_does_not_retry_409() {
    let policy = base()
        .honor_idempotency_key_for_host("b.test")
        .build()
        .unwrap();
    let a = keyed(Method::GET, "http://a.test/v1/things/1");
    assert!(!policy.classify(&a).is_keyed());
    let (svc, log) = recording(&[(0, 409), (0, 200)]);
    let res = policy.clone().layer(svc).oneshot(a).await.unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(calls(&log), 1);

    let b = keyed(Method::GET, "http://b.test/v1/things/1");
    assert!(policy.classify(&b).is_keyed());
    let (svc, log) = recording(&[(0, 409), (0, 200)]);
    let res = policy.layer(svc).oneshot(b).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(calls(&log), 2);
}

// ---------------------------------------------------------------------------------------
// 4. deadline_at across body resumes (ReadWholeLayer under the retry layer), paused time
// ---------------------------------------------------------------------------------------

/// A body that yields 10-byte chunks of a 100-byte representation from `from`, one every
/// 100 ms, and fails after three of them.
struct Trickle {
    next: usize,
    left: u32,
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl http_body::Body for Trickle {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        use std::task::Poll;
        if self.next >= 100 {
            return Poll::Ready(None);
        }
        if self.left == 0 {
            return Poll::Ready(Some(Err("connection reset".into())));
        }
        std::task::ready!(self.sleep.as_mut().poll(cx));
        let at = Instant::now() + Duration::from_millis(100);
        self.sleep.as_mut().reset(at);
        self.left -= 1;
        let start = self.next;
        self.next += 10;
        let chunk: Vec<u8> = (start..start + 10).map(|i| i as u8).collect();
        Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from(chunk)))))
    }
}

/// A GET whose body is cut every 300 ms, resumed with `Range` (a strong ETag), under a 1 s
/// deadline and 100 ms backoff: the deadline stays absolute over the resumes. The body ends
/// in an error at exactly 1000 ms, said to be the deadline's; 3 sends (bytes 0-, 30-, 60-).
#[tokio::test(start_paused = true)]
async fn the_deadline_is_absolute_across_body_resumes() {
    use tower_retry_safety::ReadWholeLayer;
    /// When each send came, and its `Range`.
    type Sends = Arc<Mutex<Vec<(Duration, Option<String>)>>>;
    let ranges: Sends = Arc::default();
    let seen = ranges.clone();
    let t0 = Instant::now();
    let svc = tower::service_fn(move |req: Request<String>| {
        let range = req
            .headers()
            .get("range")
            .map(|v| v.to_str().unwrap().to_owned());
        seen.lock().unwrap().push((t0.elapsed(), range.clone()));
        let from: usize = range
            .as_deref()
            .and_then(|r| r.strip_prefix("bytes="))
            .and_then(|r| r.strip_suffix('-'))
            .map_or(0, |n| n.parse().unwrap());
        async move {
            let body = Trickle {
                next: from,
                left: 3,
                sleep: Box::pin(tokio::time::sleep(Duration::from_millis(100))),
            };
            let mut res = Response::new(body);
            let h = res.headers_mut();
            h.insert("etag", HeaderValue::from_static("\"v1\""));
            h.insert("accept-ranges", HeaderValue::from_static("bytes"));
            h.insert("content-length", HeaderValue::from(100 - from));
            if from > 0 {
                h.insert(
                    "content-range",
                    HeaderValue::from_str(&format!("bytes {from}-99/100")).unwrap(),
                );
                *res.status_mut() = StatusCode::PARTIAL_CONTENT;
            }
            Ok::<_, Infallible>(res)
        }
    });
    let policy = RetryPolicy::builder()
        .jitter(false)
        .max_retries(100)
        .backoff(Duration::from_millis(100), Duration::from_millis(100))
        .no_budget()
        .deadline(Duration::from_secs(1))
        .build()
        .unwrap();
    let stack = policy.layer(ReadWholeLayer::new().limit(10).layer(svc));
    let res = stack
        .oneshot(
            Request::get("http://api.test/files/f")
                .body(String::new())
                .unwrap(),
        )
        .await
        .unwrap();
    let (bytes, err) = support::read_whole::read_all(res.into_body()).await;
    let err = err.expect("the deadline ends the body");
    assert_eq!(t0.elapsed(), Duration::from_millis(1_000));
    let cut = support::read_whole::find_cut(&*err).expect("a BodyCutError");
    assert!(cut.is_deadline(), "{cut}");
    let expect: Vec<u8> = (0..bytes.len()).map(|i| i as u8).collect();
    assert_eq!(
        bytes, expect,
        "the bytes delivered are the representation's, in order"
    );
    let ranges = ranges.lock().unwrap();
    let froms: Vec<_> = ranges.iter().map(|(_, r)| r.clone()).collect();
    assert_eq!(
        froms,
        [
            None,
            Some("bytes=30-".to_owned()),
            Some("bytes=60-".to_owned())
        ],
        "{ranges:?}"
    );
}

// ---------------------------------------------------------------------------------------
// 1b. A renewal that arrives late (sent from a neighbour's task, or the ticker, after the
//     claim's outcome was stored or its key released): every store refuses it and changes
//     nothing. Real leases and TTLs, waited out; nothing is timed.
// ---------------------------------------------------------------------------------------

#[cfg(feature = "postgres")]
#[path = "pg/mod.rs"]
mod pg;

fn fp() -> Fingerprint {
    Fingerprint::of(&Method::POST, "/v1/writes", b"{}")
}

async fn claim_of<S: IdempotencyStore>(store: &S, key: &str, lease: Duration) -> Claim {
    match store.begin(key, fp(), lease).await.unwrap() {
        Begin::Started(c) => c,
        other => panic!("{key}: expected a claim, got {other:?}"),
    }
}

/// Per store: (1) a renewal after `complete` is refused as fenced, leaves the record as it was
/// and does not extend it (a 400 ms TTL still ends); (2) after `release`, refused, and the key
/// stays free (the next `begin` starts); (3) after release and a new claim by another request,
/// the old claim's renewal is refused and the new claim's lease is its own (it ends when not
/// renewed, 400 ms).
async fn late_renewals_change_nothing<S: IdempotencyStore>(store: S, ns: &str) {
    let key = |n: &str| format!("{ns}{n}");
    let ttl = Duration::from_millis(400);
    let long = Duration::from_secs(60);

    let c = claim_of(&store, &key("done"), long).await;
    let response = StoredResponse::new(
        StatusCode::CREATED,
        HeaderMap::new(),
        Bytes::from_static(b"ok"),
    );
    store
        .complete(&key("done"), c, fp(), response.clone(), ttl)
        .await
        .unwrap();
    let err = store.renew(&key("done"), c, long).await.unwrap_err();
    assert!(err.is_fenced(), "{err}");
    assert_eq!(
        store.get(&key("done")).await.unwrap(),
        Some(Entry::Completed {
            fingerprint: fp(),
            response
        })
    );
    tokio::time::sleep(ttl * 3).await;
    assert_eq!(
        store.get(&key("done")).await.unwrap(),
        None,
        "the renewal extended a completed record"
    );

    let c = claim_of(&store, &key("freed"), long).await;
    store.release(&key("freed"), c).await.unwrap();
    assert!(store
        .renew(&key("freed"), c, long)
        .await
        .unwrap_err()
        .is_fenced());
    assert_eq!(
        store.get(&key("freed")).await.unwrap(),
        None,
        "the renewal resurrected a released key"
    );
    let again = claim_of(&store, &key("freed"), ttl).await;
    assert_ne!(again, c);
    assert!(store
        .renew(&key("freed"), c, long)
        .await
        .unwrap_err()
        .is_fenced());
    tokio::time::sleep(ttl * 3).await;
    assert_eq!(
        store.get(&key("freed")).await.unwrap(),
        None,
        "the stale renewal extended the new claim"
    );
}

#[tokio::test]
async fn memory_store_refuses_late_renewals() {
    late_renewals_change_nothing(MemoryStore::new(), "late:").await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_store_refuses_late_renewals() {
    use tower_retry_safety::server::RedisStore;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let prefix = format!("trs-review1204-late-{}-{nanos}:", std::process::id());
    let store = RedisStore::connect("redis://127.0.0.1:6379")
        .await
        .expect("Redis on 127.0.0.1:6379")
        .prefix(prefix);
    late_renewals_change_nothing(store, "k:").await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_store_refuses_late_renewals() {
    use tower_retry_safety::server::PostgresStore;
    let db = pg::TestDb::new().await;
    let store = PostgresStore::from_pool(db.pool(4).await);
    store.migrate().await.unwrap();
    late_renewals_change_nothing(store, "k:").await;
}

/// Minted keys go into the head every retry and hedge copies: a POST answered 503 then 200 is
/// sent twice with the one minted key (one value each); hedged (`keyed_writes`), its hedge
/// carries the same key. A DELETE a marker calls a write gets a key but unscoped trust yields
/// to the marker: a 503 is final, 1 call.
#[tokio::test(start_paused = true)]
async fn minted_keys_are_copied_once_into_every_resend() {
    let policy = base().mint_idempotency_keys(true).build().unwrap();
    let (svc, log) = recording(&[(0, 503), (0, 200)]);
    let post = Request::post("http://api.test/v1/orders")
        .body(String::from("{}"))
        .unwrap();
    let res = policy.clone().layer(svc).oneshot(post).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    {
        let seen = log.lock().unwrap();
        assert_eq!(seen.len(), 2);
        let k0 = values(&seen[0].headers, "idempotency-key");
        assert_eq!(k0.len(), 1);
        assert_eq!(values(&seen[1].headers, "idempotency-key"), k0);
    }

    let hedged = base()
        .mint_idempotency_keys(true)
        .hedge(
            Hedge::fixed(Duration::from_millis(50))
                .max_extra_load(1.0)
                .keyed_writes(true),
        )
        .build()
        .unwrap();
    let (svc, log) = recording(&[(10_000, 200), (0, 200)]);
    let post = Request::post("http://api.test/v1/orders")
        .body(String::from("{}"))
        .unwrap();
    hedged.layer(svc).oneshot(post).await.unwrap();
    {
        let seen = log.lock().unwrap();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[1].at, Duration::from_millis(50));
        let k0 = values(&seen[0].headers, "idempotency-key");
        assert_eq!(k0.len(), 1);
        assert_eq!(values(&seen[1].headers, "idempotency-key"), k0);
    }

    let (svc, log) = recording(&[(0, 503), (0, 200)]);
    let mut delete = Request::delete("http://api.test/v1/queue/head")
        .body(String::new())
        .unwrap();
    delete.extensions_mut().insert(Idempotency::NonIdempotent);
    let res = policy.layer(svc).oneshot(delete).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    let seen = log.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(values(&seen[0].headers, "idempotency-key").len(), 1);
}

/// A keyed PUT (source Method now, so hedged like an unkeyed PUT) against a real
/// IdempotencyLayer server whose handler takes 600 ms: the hedge meets the original in flight
/// (409, retried with backoff, never final while the original runs). The handler runs exactly
/// once and the caller gets the original's 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedged_keyed_put_against_the_server_layer_runs_once() {
    let runs = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(AtomicUsize::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let layer = IdempotencyLayer::new(MemoryStore::new()).lease(Duration::from_secs(5));
    let counter = runs.clone();
    let svc = layer.layer(tower::service_fn(move |_req: Request<_>| {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(600)).await;
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"put"))))
        }
    }));
    let requests = seen.clone();
    let server = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (svc, requests) = (svc.clone(), requests.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    requests.fetch_add(1, Ordering::SeqCst);
                    tower::ServiceExt::oneshot(svc.clone(), req)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    let policy = RetryPolicy::builder()
        .jitter(false)
        .no_budget()
        .max_retries(5)
        .backoff(Duration::from_millis(100), Duration::from_millis(100))
        .honor_idempotency_key(true)
        .hedge(Hedge::fixed(Duration::from_millis(50)).max_extra_load(1.0))
        .build()
        .unwrap();
    let stack = policy.layer(client());
    let req = Request::put(format!("http://{addr}/v1/things/1"))
        .header("idempotency-key", "\"put-1204\"")
        .body(Full::new(Bytes::from_static(b"{\"v\":1}")))
        .unwrap();
    let res = stack.oneshot(req).await.unwrap();
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        (status, &body[..]),
        (StatusCode::OK, &b"put"[..]),
        "sent {}",
        seen.load(Ordering::SeqCst)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(seen.load(Ordering::SeqCst) >= 2, "the PUT was hedged");
    server.abort();
}

/// A body of 100 bytes in 10-byte chunks every 100 ms, through `ReadWholeLayer` with `limit`,
/// under a policy or request attempt timeout of `Duration::MAX`: the bytes and error read, and
/// the sends.
async fn read_whole_with_max_attempt_timeout(
    limit: u64,
    in_policy: bool,
) -> (usize, Option<String>, usize) {
    use tower_retry_safety::ReadWholeLayer;
    let sends = Arc::new(AtomicUsize::new(0));
    let counter = sends.clone();
    let svc = tower::service_fn(move |_req: Request<String>| {
        counter.fetch_add(1, Ordering::SeqCst);
        async move {
            let body = Trickle {
                next: 0,
                left: 10,
                sleep: Box::pin(tokio::time::sleep(Duration::from_millis(100))),
            };
            let mut res = Response::new(body);
            res.headers_mut()
                .insert("content-length", HeaderValue::from(100));
            Ok::<_, Infallible>(res)
        }
    });
    let mut builder = RetryPolicy::builder().no_budget().deadline(Duration::MAX);
    if in_policy {
        builder = builder.attempt_timeout(Duration::MAX);
    }
    let policy = builder.build().unwrap();
    let mut req = Request::get("http://api.test/files/f")
        .body(String::new())
        .unwrap();
    if !in_policy {
        req.extensions_mut()
            .insert(RequestOptions::new().attempt_timeout(Duration::MAX));
    }
    let stack = policy.layer(ReadWholeLayer::new().limit(limit).layer(svc));
    let res = stack.oneshot(req).await.unwrap();
    let (bytes, err) = support::read_whole::read_all(res.into_body()).await;
    (
        bytes.len(),
        err.map(|e| e.to_string()),
        sends.load(Ordering::SeqCst),
    )
}

/// FIXED (was an open defect). `Duration::MAX` as the per-attempt timeout in the policy
/// (`RetryPolicyBuilder::attempt_timeout`, which accepts it) with a GET whose body goes through
/// `ReadWholeLayer` (100 bytes in 10-byte chunks, read inside the attempt with the default
/// 64 KiB limit, or streamed past a 10-byte limit): the caller's first `poll_frame` panics
/// with "overflow when adding duration to instant" at `src/attempt_clock.rs:84`
/// (`FrameClock::end`: `Instant::now() + wait`, the per-attempt timeout being the per-frame
/// wait), from `WholeBody::poll_frame` (`src/resume/body.rs:191`). Both limits panic (0 of 100
/// bytes read). Expected: 100 bytes, no error, 1 send, as `deadline(Duration::MAX)` now
/// behaves (no deadline) and as the attempt's own timer behaves (tokio's `sleep` saturates).
/// The same `FrameClock` times resumed bodies (`src/resume/future.rs:132`) and the reqwest
/// adapter's `ReadWholeMiddleware` (`reqwest_read_whole_with_a_duration_max_attempt_timeout`). Proposed fix: a per-frame wait too long to be a time is no per-frame
/// limit: drop it in `FrameClock::new` (`frame_wait.filter(|w|
/// Instant::now().checked_add(*w).is_some())`, so a clock left with neither limit is `None`),
/// and saturate in `end` (`checked_add`, else a far-future instant). Not merely `.and_then`
/// in `end`: with no deadline `end` would then return `Instant::now()` and cut every body.
#[tokio::test(start_paused = true)]
async fn a_duration_max_attempt_timeout_in_the_policy_with_a_read_whole_body() {
    assert_eq!(
        read_whole_with_max_attempt_timeout(64 * 1024, true).await,
        (100, None, 1)
    );
    assert_eq!(
        read_whole_with_max_attempt_timeout(10, true).await,
        (100, None, 1)
    );
}

/// FIXED (was an open defect). The same panic from a per-request
/// `RequestOptions::attempt_timeout(Duration::MAX)` (see
/// `a_duration_max_attempt_timeout_in_the_policy_with_a_read_whole_body`), with either limit:
/// "overflow when adding duration to instant" at `src/attempt_clock.rs:84`, in the caller's
/// body read (0 of 100 bytes). Expected 100 bytes, no error, 1 send. Same fix.
#[tokio::test(start_paused = true)]
async fn a_duration_max_attempt_timeout_in_request_options_with_a_read_whole_body() {
    assert_eq!(
        read_whole_with_max_attempt_timeout(64 * 1024, false).await,
        (100, None, 1)
    );
    assert_eq!(
        read_whole_with_max_attempt_timeout(10, false).await,
        (100, None, 1)
    );
}

/// The reqwest adapter with `ReadWholeMiddleware` and `attempt_timeout(Duration::MAX)` in the
/// policy, against a loopback server that sends 100 bytes in 10-byte chunks: the body's bytes
/// and error, and the requests the server saw.
#[cfg(feature = "reqwest-middleware")]
async fn reqwest_read_whole_with_max_attempt_timeout() -> (usize, Option<String>, usize) {
    use tower_retry_safety::{ReadWholeMiddleware, RetrySafetyMiddleware};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let requests = seen.clone();
    let server = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let requests = requests.clone();
            tokio::spawn(async move {
                let svc =
                    hyper::service::service_fn(move |_req: Request<hyper::body::Incoming>| {
                        requests.fetch_add(1, Ordering::SeqCst);
                        async move {
                            let body = Trickle {
                                next: 0,
                                left: 10,
                                sleep: Box::pin(tokio::time::sleep(Duration::from_millis(20))),
                            };
                            let mut res = Response::new(body);
                            res.headers_mut()
                                .insert("content-length", HeaderValue::from(100));
                            Ok::<_, Infallible>(res)
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    // Real time here: the first chunk after 20 ms, the others 100 ms apart (~0.9 s in all).
    let policy = RetryPolicy::builder()
        .no_budget()
        .attempt_timeout(Duration::MAX)
        .build()
        .unwrap();
    let client = reqwest::Client::new();
    let client = reqwest_middleware::ClientBuilder::new(client.clone())
        .with(RetrySafetyMiddleware::new(policy))
        .with(ReadWholeMiddleware::new().resume_with(client))
        .build();
    let mut res = client
        .get(format!("http://{addr}/files/f"))
        .send()
        .await
        .unwrap();
    let mut bytes = 0;
    let mut err = None;
    loop {
        match res.chunk().await {
            Ok(Some(c)) => bytes += c.len(),
            Ok(None) => break,
            Err(e) => {
                err = Some(e.to_string());
                break;
            }
        }
    }
    server.abort();
    (bytes, err, seen.load(Ordering::SeqCst))
}

/// FIXED (was an open defect). The reqwest adapter has the same panic, earlier: `send().await` itself panics
/// with "overflow when adding duration to instant" at `src/attempt_clock.rs:84`
/// (`FrameClock::end`), from `resume::future::Reading::poll_stall` (`src/resume/future.rs:232`,
/// the body read inside the attempt by `ReadWholeMiddleware`). The server saw 1 request; the
/// caller got a panic instead of 100 bytes. Expected `(100, None, 1)`. Same fix as
/// `a_duration_max_attempt_timeout_in_the_policy_with_a_read_whole_body`.
#[cfg(feature = "reqwest-middleware")]
#[tokio::test]
async fn reqwest_read_whole_with_a_duration_max_attempt_timeout() {
    assert_eq!(
        reqwest_read_whole_with_max_attempt_timeout().await,
        (100, None, 1)
    );
}
