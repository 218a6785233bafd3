//! A GOAWAY storm: a hyper h2 server shuts each connection down gracefully every 7 requests
//! while 64 body-less requests are in flight on hyper-util's client. hyper can hand a request
//! the connection's GOAWAY after its HEADERS were queued, so a remote GOAWAY does not prove a
//! POST unsent: no write may be applied twice, and an error that says "not sent" must be right.
#![cfg(feature = "h2")]

use std::collections::HashMap;
use std::convert::Infallible;
use std::error::Error as StdError;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_retry_safety::RetryPolicy;

use retry_safety_testing::soak::soak;

const IN_FLIGHT: usize = 64;
/// Bounds an attempt that hyper never completes: about one run in ten here, with or without
/// this layer, some requests get a connection from hyper-util's pool and never reach the
/// server. A timed-out attempt is ambiguous, so this loosens nothing below.
const PER_ATTEMPT: Duration = Duration::from_secs(1);
/// Requests a connection serves before the server starts its graceful shutdown.
const SHUTDOWN_EVERY: usize = 7;

type Applied = Arc<Mutex<HashMap<usize, u32>>>;
type Conns = Arc<Mutex<Vec<JoinHandle<()>>>>;

/// The operation id from `/ops/{n}`.
fn op_of(req: &Request<Incoming>) -> usize {
    req.uri()
        .path()
        .strip_prefix("/ops/")
        .and_then(|n| n.parse().ok())
        .unwrap_or(usize::MAX)
}

/// One connection: counts each request it hands to the application (the side effect), and
/// starts a graceful shutdown (GOAWAY) at its 7th.
async fn serve_one(socket: tokio::net::TcpStream, applied: Applied) {
    let served = Arc::new(AtomicUsize::new(0));
    let shutdown = Arc::new(Notify::new());
    let svc = {
        let shutdown = shutdown.clone();
        service_fn(move |req: Request<Incoming>| {
            *applied.lock().unwrap().entry(op_of(&req)).or_default() += 1;
            if served.fetch_add(1, Ordering::SeqCst) + 1 == SHUTDOWN_EVERY {
                shutdown.notify_one();
            }
            async { Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new())) }
        })
    };
    let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(socket), svc);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = shutdown.notified() => conn.as_mut().graceful_shutdown(),
    }
    let _ = conn.await;
}

/// Accepts until aborted; keeps every connection's task so the test can end them all before
/// it reads the counts.
fn serve(listener: TcpListener, applied: Applied) -> (JoinHandle<()>, Conns) {
    let conns: Conns = Arc::default();
    let tracked = conns.clone();
    let accept = tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let conn = tokio::spawn(serve_one(socket, applied.clone()));
            tracked.lock().unwrap().push(conn);
        }
    });
    (accept, conns)
}

/// True when a remote GOAWAY is somewhere in the error's source chain.
fn remote_goaway(err: &(dyn StdError + 'static)) -> bool {
    std::iter::successors(Some(err), |&e| e.source())
        .filter_map(|e| e.downcast_ref::<h2::Error>())
        .any(|e| e.is_remote() && e.is_go_away())
}

enum Outcome {
    Response(StatusCode),
    Error {
        not_sent: bool,
        goaway: bool,
        timeout: bool,
    },
}

/// Ends the accept loop and every connection (awaited, so none is still running), so no
/// request can be applied after the counts are read.
async fn stop(accept: JoinHandle<()>, conns: Conns) {
    accept.abort();
    let _ = accept.await;
    let tasks: Vec<_> = conns.lock().unwrap().drain(..).collect();
    for conn in tasks {
        conn.abort();
        let _ = conn.await;
    }
}

/// hyper-util's HTTP/2 client under the layer and a per-attempt timeout; every attempt that
/// fails with a remote GOAWAY, whatever the layer makes of it, is counted in `goaway_attempts`.
fn storm_client(
    goaway_attempts: Arc<AtomicUsize>,
) -> impl Service<
    Request<Empty<Bytes>>,
    Response = Response<Incoming>,
    Error = tower_retry_safety::Error,
    Future: Send,
> + Clone
       + Send
       + 'static {
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Empty<Bytes>>();
    let counted = tower::service_fn(move |req| {
        let (client, goaway_attempts) = (client.clone(), goaway_attempts.clone());
        async move {
            let res = client.request(req).await;
            if let Err(e) = &res {
                if remote_goaway(e) {
                    goaway_attempts.fetch_add(1, Ordering::SeqCst);
                }
            }
            res
        }
    });
    let policy = RetryPolicy::builder()
        .max_retries(6)
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .no_budget()
        .build()
        .unwrap();
    ServiceBuilder::new()
        .layer(policy)
        .timeout(PER_ATTEMPT)
        .service(counted)
}

type Outcomes = Arc<Mutex<HashMap<usize, (Method, Outcome)>>>;

/// Runs `total_ops` operations through `svc`, `IN_FLIGHT` at a time, one read in eight; each
/// one's method and outcome.
async fn run_storm<S>(svc: &S, addr: SocketAddr, total_ops: usize) -> Outcomes
where
    S: Service<
            Request<Empty<Bytes>>,
            Response = Response<Incoming>,
            Error = tower_retry_safety::Error,
        > + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let outcomes: Outcomes = Arc::default();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..IN_FLIGHT {
        let (svc, next, outcomes) = (svc.clone(), next.clone(), outcomes.clone());
        workers.spawn(async move {
            loop {
                let op = next.fetch_add(1, Ordering::SeqCst);
                if op >= total_ops {
                    return;
                }
                // One read in eight: a GET that meets a GOAWAY is retried either way.
                let method = if op.is_multiple_of(8) {
                    Method::GET
                } else {
                    Method::POST
                };
                let req = Request::builder()
                    .method(method.clone())
                    .uri(format!("http://{addr}/ops/{op}"))
                    .body(Empty::<Bytes>::new())
                    .unwrap();
                let outcome = match svc.clone().oneshot(req).await {
                    Ok(res) => Outcome::Response(res.status()),
                    Err(e) => Outcome::Error {
                        not_sent: e.is_not_sent(),
                        goaway: remote_goaway(&e),
                        timeout: e.is_timeout(),
                    },
                };
                outcomes.lock().unwrap().insert(op, (method, outcome));
            }
        });
    }
    while let Some(worker) = workers.join_next().await {
        worker.expect("no panic in a worker");
    }
    outcomes
}

/// The storm's outcomes, counted against what the server applied.
#[derive(Default)]
struct Tally {
    ok: usize,
    suppressed: usize,
    not_sent: usize,
    goaway_errors: usize,
    timeouts: usize,
    reads: usize,
    reads_ok: usize,
    /// Writes applied twice.
    twice: Vec<usize>,
    /// Writes that broke a rule: a 200 not applied exactly once, "not sent" but applied, or
    /// "not sent" on a GOAWAY.
    wrong: Vec<String>,
}

fn tally(applied: &HashMap<usize, u32>, outcomes: &HashMap<usize, (Method, Outcome)>) -> Tally {
    let mut t = Tally::default();
    for (&op, (method, outcome)) in outcomes.iter() {
        let times = applied.get(&op).copied().unwrap_or(0);
        if *method == Method::GET {
            t.reads += 1;
            t.reads_ok += usize::from(matches!(outcome, Outcome::Response(StatusCode::OK)));
            continue;
        }
        if times > 1 {
            t.twice.push(op);
        }
        match *outcome {
            Outcome::Response(status) => {
                t.ok += 1;
                if status != StatusCode::OK || times != 1 {
                    t.wrong.push(format!("op {op}: {status}, applied {times}"));
                }
            }
            Outcome::Error {
                not_sent: true,
                goaway,
                ..
            } => {
                t.not_sent += 1;
                if times != 0 || goaway {
                    t.wrong.push(format!(
                        "op {op}: not sent, applied {times}, goaway {goaway}"
                    ));
                }
            }
            Outcome::Error {
                not_sent: false,
                goaway,
                timeout,
            } => {
                t.suppressed += 1;
                t.goaway_errors += usize::from(goaway);
                t.timeouts += usize::from(timeout);
            }
        }
    }
    t
}

// Two workers: hyper's connection task and its dispatch task must run in parallel for a
// GOAWAY to land between a request's send_request and hyper's next poll_ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goaway_storm_never_applies_a_write_twice() {
    // Under a second by default; `RETRY_SAFETY_SOAK=1` for the long storm.
    let total_ops: usize = soak(4_000, 100_000);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let applied: Applied = Arc::default();
    let (accept, conns) = serve(listener, applied.clone());

    // Every attempt that failed with a remote GOAWAY, whatever the layer made of it.
    let goaway_attempts = Arc::new(AtomicUsize::new(0));
    let svc = storm_client(goaway_attempts.clone());

    let outcomes = run_storm(&svc, addr, total_ops).await;
    drop(svc);
    stop(accept, conns).await;

    let applied = applied.lock().unwrap();
    let outcomes = outcomes.lock().unwrap();
    assert_eq!(outcomes.len(), total_ops);
    // Writes that broke a rule: applied twice, a 200 not applied exactly once, "not sent" but
    // applied, or "not sent" on a GOAWAY.
    let Tally {
        ok,
        suppressed,
        not_sent,
        goaway_errors,
        timeouts,
        reads,
        reads_ok,
        twice,
        wrong,
    } = tally(&applied, &outcomes);
    let goaway_attempts = goaway_attempts.load(Ordering::SeqCst);
    println!(
        "goaway storm: ops {total_ops}, applied twice {}, ok {ok}, suppressed {suppressed}, \
         not-sent {not_sent}, goaway attempts {goaway_attempts}, suppressed by goaway \
         {goaway_errors}, timeouts {timeouts}, reads ok {reads_ok}/{reads}",
        twice.len()
    );
    assert!(twice.is_empty(), "writes applied twice: {twice:?}");
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert_eq!(reads_ok, reads, "every GET is retried until it succeeds");
    // Not vacuous: the storm made attempts fail with a remote GOAWAY, and writes among them
    // came back as errors that say they may have been applied.
    assert!(goaway_attempts > 0, "no attempt failed with a GOAWAY");
    assert!(goaway_errors > 0, "no write was suppressed after a GOAWAY");
}
