//! A bounded chaos soak: thousands of reads and writes, 32 in flight, through hyper-util's
//! client and the layer, against a loopback server that draws a fault for every attempt and
//! restarts now and then (connections refused for a moment, in-flight ones cut). The seed is
//! printed; set `CHAOS_SEED` to replay a run's faults. 5,000 operations by default (a few
//! seconds), 100,000 with `RETRY_SAFETY_SOAK=1`.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::{AbortHandle, JoinHandle};
use tower::timeout::Timeout;
use tower::{ServiceBuilder, ServiceExt};
use tower_retry_safety::{FailureClass, RetryPolicy, RetryReport, RetrySafety, StopReason};

use retry_safety_testing::soak::soak;

const IN_FLIGHT: usize = 32;
const PER_ATTEMPT: Duration = Duration::from_millis(100);
const SLOW: Duration = Duration::from_millis(250);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    None,
    DropAfterApply,
    SlowAfterApply,
    UnavailableAfterApply,
    TooManyRequests,
    ResetBeforeApply,
}

/// splitmix64: the fault of an attempt depends only on (seed, op, attempt), not on timing.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn fault(seed: u64, op: u64, attempt: u64) -> Fault {
    match mix(seed ^ mix(op ^ mix(attempt))) % 100 {
        0..=49 => Fault::None,
        50..=59 => Fault::DropAfterApply,
        60..=64 => Fault::SlowAfterApply,
        65..=74 => Fault::UnavailableAfterApply,
        75..=84 => Fault::TooManyRequests,
        _ => Fault::ResetBeforeApply,
    }
}

#[derive(Default)]
struct Op {
    seen: u32,
    applied: u32,
}

struct Server {
    seed: u64,
    ops: Mutex<HashMap<u64, Op>>,
    conns: Mutex<Vec<AbortHandle>>,
}

async fn handle(
    server: Arc<Server>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, io::Error> {
    let op: u64 = req
        .uri()
        .path()
        .rsplit('/')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::MAX);
    let write = req.method() != Method::GET;
    let attempt = {
        let mut ops = server.ops.lock().unwrap();
        let o = ops.entry(op).or_default();
        o.seen += 1;
        o.seen
    };
    let apply = || {
        if write {
            server.ops.lock().unwrap().entry(op).or_default().applied += 1;
        }
    };
    let reply = |status: StatusCode| {
        let mut res = Response::new(Full::new(Bytes::from_static(b"ok")));
        *res.status_mut() = status;
        res
    };
    match fault(server.seed, op, u64::from(attempt)) {
        Fault::None => {
            apply();
            Ok(reply(StatusCode::OK))
        }
        Fault::DropAfterApply => {
            apply();
            Err(io::Error::other("drop"))
        }
        Fault::SlowAfterApply => {
            apply();
            tokio::time::sleep(SLOW).await;
            Ok(reply(StatusCode::OK))
        }
        Fault::UnavailableAfterApply => {
            apply();
            Ok(reply(StatusCode::SERVICE_UNAVAILABLE))
        }
        Fault::TooManyRequests => {
            let mut res = reply(StatusCode::TOO_MANY_REQUESTS);
            res.headers_mut()
                .insert("retry-after", "0".parse().unwrap());
            Ok(res)
        }
        Fault::ResetBeforeApply => Err(io::Error::other("reset")),
    }
}

/// Accepts until aborted; each connection's task is tracked so a restart can cut it.
fn listen(server: Arc<Server>, listener: TcpListener) -> AbortHandle {
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let s = server.clone();
            let conn = tokio::spawn(async move {
                let svc = service_fn(move |req| handle(s.clone(), req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
            server.conns.lock().unwrap().push(conn.abort_handle());
        }
    })
    .abort_handle()
}

fn stop(server: &Server, accept: &AbortHandle) {
    accept.abort();
    for conn in server.conns.lock().unwrap().drain(..) {
        conn.abort();
    }
}

#[derive(Default, Debug)]
struct Tally {
    writes: usize,
    reads: usize,
    recovered: usize,
    suppressed: usize,
    read_errors: usize,
    attempts: u64,
}

/// What the client said of an operation: its attempts, how many it classified as not sent,
/// and, for an error, whether it called it ambiguous.
type Outcome = (u32, u32, Option<bool>);

/// The layer over a per-attempt timeout over hyper-util's HTTP/1.1 client.
type ChaosClient = RetrySafety<Timeout<Client<HttpConnector, Full<Bytes>>>>;

/// The run's seed: `CHAOS_SEED`, or a fixed one; printed so a run can be replayed.
fn chaos_seed() -> u64 {
    let seed: u64 = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_2026);
    println!("chaos seed {seed} (replay with CHAOS_SEED={seed})");
    seed
}

/// A server drawing its faults from `seed`, listening on loopback: the server, its address and
/// its accept loop (replaced at each restart).
async fn start_server(seed: u64) -> (Arc<Server>, SocketAddr, Arc<Mutex<AbortHandle>>) {
    let server = Arc::new(Server {
        seed,
        ops: Mutex::default(),
        conns: Mutex::default(),
    });
    // Below the ephemeral range: while it is down between restarts, no port-0 listener of
    // another test takes its port (the chaos client would then talk to that one).
    let listener = TcpListener::bind(("127.0.0.1", retry_safety_testing::ports::free_port()))
        .await
        .expect("bind the drawn port");
    let addr: SocketAddr = listener.local_addr().unwrap();
    let accept = Arc::new(Mutex::new(listen(server.clone(), listener)));
    (server, addr, accept)
}

/// Restarts the server every 300 ms, down for 30 ms, until `done`; counts the restarts.
fn restart_until_done(
    server: Arc<Server>,
    accept: Arc<Mutex<AbortHandle>>,
    addr: SocketAddr,
    done: Arc<AtomicBool>,
    restarts: Arc<AtomicUsize>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        while !done.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(300)).await;
            stop(&server, &accept.lock().unwrap());
            tokio::time::sleep(Duration::from_millis(30)).await;
            let Ok(listener) = TcpListener::bind(addr).await else {
                continue;
            };
            *accept.lock().unwrap() = listen(server.clone(), listener);
            restarts.fetch_add(1, Ordering::SeqCst);
        }
    })
}

fn chaos_client() -> ChaosClient {
    let policy = RetryPolicy::builder()
        .max_retries(4)
        .backoff(Duration::from_millis(5), Duration::from_millis(40))
        .tps_budget(Duration::from_secs(10), 200, 0.5)
        .build()
        .unwrap();
    ServiceBuilder::new()
        .layer(policy)
        .timeout(PER_ATTEMPT)
        .service(Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>())
}

/// Operation `op`, a write or a read as the seed draws it, through `svc`: its counts go into
/// `tally`, what the client said of it into `outcomes`. A read's error must be a retry limit.
async fn run_op(
    svc: &ChaosClient,
    seed: u64,
    addr: SocketAddr,
    op: usize,
    tally: &Mutex<Tally>,
    outcomes: &Mutex<HashMap<u64, Outcome>>,
) {
    let write = mix(mix(seed) ^ op as u64).is_multiple_of(2);
    let method = if write { Method::POST } else { Method::GET };
    let req = Request::builder()
        .method(method)
        .uri(format!("http://{addr}/ops/{op}"))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let out = svc.clone().oneshot(req).await;
    let report: Option<RetryReport> = match &out {
        Ok(res) => res.extensions().get::<RetryReport>().cloned(),
        Err(e) => e.report().cloned(),
    };
    let report = report.expect("every outcome carries a report");
    let not_sent = report
        .attempt_outcomes()
        .filter(|r| r.class() == FailureClass::NotSent)
        .count() as u32;
    {
        let mut t = tally.lock().unwrap();
        t.attempts += u64::from(report.attempts());
        if write {
            t.writes += 1;
            t.suppressed += usize::from(report.retry_suppressed());
        } else {
            t.reads += 1;
            match &out {
                Ok(res) if res.status() == StatusCode::OK => t.recovered += 1,
                Ok(_) => {}
                Err(e) => {
                    t.read_errors += 1;
                    assert!(
                        matches!(
                            e.stop_reason(),
                            StopReason::RetriesExhausted | StopReason::Budget
                        ),
                        "read {op}: {e}"
                    );
                }
            }
        }
    }
    let ambiguous = out.as_ref().err().map(|e| e.is_ambiguous());
    outcomes
        .lock()
        .unwrap()
        .insert(op as u64, (report.attempts(), not_sent, ambiguous));
    if let Ok(res) = out {
        let _ = res.into_body().collect().await;
    }
}

/// Runs `total_ops` operations through `svc`, `IN_FLIGHT` at a time; their tally and outcomes.
async fn run_workload(
    svc: &ChaosClient,
    seed: u64,
    addr: SocketAddr,
    total_ops: usize,
) -> (Arc<Mutex<Tally>>, Arc<Mutex<HashMap<u64, Outcome>>>) {
    let next = Arc::new(AtomicUsize::new(0));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let outcomes = Arc::new(Mutex::new(HashMap::new()));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..IN_FLIGHT {
        let (svc, next, tally, outcomes) =
            (svc.clone(), next.clone(), tally.clone(), outcomes.clone());
        workers.spawn(async move {
            loop {
                let op = next.fetch_add(1, Ordering::SeqCst);
                if op >= total_ops {
                    return;
                }
                run_op(&svc, seed, addr, op, &tally, &outcomes).await;
            }
        });
    }
    while let Some(worker) = workers.join_next().await {
        worker.expect("no panic in a worker");
    }
    (tally, outcomes)
}

/// "Not sent" is never wrong: every attempt the server saw was classified as sent, and an
/// error that reached the server says it is ambiguous.
fn check_not_sent_is_never_wrong(ops: &HashMap<u64, Op>, outcomes: &HashMap<u64, Outcome>) {
    for (op, (attempts, not_sent, ambiguous)) in outcomes.iter() {
        let seen = ops.get(op).map_or(0, |o| o.seen);
        assert!(
            seen <= attempts - not_sent,
            "op {op}: server saw {seen}, client says {not_sent} of {attempts} were not sent"
        );
        // An error that says "not sent" must be right; "ambiguous" may be cautious (a
        // connection cut by a restart before the handler ran looks the same as after).
        if let Some(ambiguous) = ambiguous {
            if seen > 0 {
                assert!(
                    *ambiguous,
                    "op {op}: reached the server but reported not sent"
                );
            }
        }
    }
}

/// The runtime's alive tasks, once they had up to 2 s to end.
async fn alive_tasks_after_settling() -> usize {
    let metrics = tokio::runtime::Handle::current().metrics();
    let mut alive = metrics.num_alive_tasks();
    for _ in 0..200 {
        if alive == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        alive = metrics.num_alive_tasks();
    }
    alive
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_soak() {
    let seed = chaos_seed();
    // A few seconds by default; `RETRY_SAFETY_SOAK=1` for the long soak.
    let total_ops: usize = soak(5_000, 100_000);

    let (server, addr, accept) = start_server(seed).await;

    // Restart the server every 300 ms, down for 30 ms, until the workload ends.
    let done = Arc::new(AtomicBool::new(false));
    let restarts = Arc::new(AtomicUsize::new(0));
    let restarter = restart_until_done(
        server.clone(),
        accept.clone(),
        addr,
        done.clone(),
        restarts.clone(),
    );

    let svc = chaos_client();
    let (tally, outcomes) = run_workload(&svc, seed, addr, total_ops).await;
    done.store(true, Ordering::SeqCst);
    restarter.await.unwrap();
    stop(&server, &accept.lock().unwrap());

    // The checks hold locks: keep them apart from the awaits below.
    {
        let ops = server.ops.lock().unwrap();
        let applied_twice = ops.values().filter(|o| o.applied > 1).count();
        assert_eq!(applied_twice, 0, "a write was applied twice");
        check_not_sent_is_never_wrong(&ops, &outcomes.lock().unwrap());

        let t = tally.lock().unwrap();
        assert_eq!(t.writes + t.reads, total_ops);
        assert!(
            restarts.load(Ordering::SeqCst) > 0,
            "the server never restarted"
        );
        println!(
            "chaos: ops {total_ops}, writes {}, applied_twice={applied_twice}, reads {}, recovered {}, suppressed {}, attempts {} (restarts {}, read errors {})",
            t.writes,
            t.reads,
            t.recovered,
            t.suppressed,
            t.attempts,
            restarts.load(Ordering::SeqCst),
            t.read_errors
        );
    }
    drop(svc);

    // Nothing left running: the client's connections close once it is dropped.
    let alive = alive_tasks_after_settling().await;
    assert_eq!(alive, 0, "tasks left running");
}
