//! Servers that break the run-once rules in ways the check could not observe, or took for
//! something else: the check does not pass them.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use retry_safety_lab::headers::{HOLD_HEADER, RUN_HEADER};
use retry_safety_lab::{KeysCheck, RuleVerdict};
use tokio::net::TcpListener;

/// How the stand-in server treats a key.
#[derive(Clone, Copy)]
enum Breaks {
    /// Checks the key's syntax and its payload, then runs the handler for every request:
    /// one constant answer, no run header, and no failure on request.
    RerunsEveryRepeat,
    /// Runs a key's handler once, with the run header; a repeat that arrives while it runs
    /// waits for it and gets its answer: never a 409.
    HoldsRepeats,
    /// Runs the handler, then stores its answer under the key: requests that arrive while
    /// it runs run it too. One constant answer, no run header.
    RunsThenInserts,
    /// Keeps every rule (409 while a key's handler runs), but compares keys without case.
    CaseInsensitive,
    /// Keeps every rule, but forgets a key a second after its first request.
    ForgetsAfterOneSecond,
}

type Stored = Arc<tokio::sync::Mutex<Option<(u64, u16)>>>;

/// The first payload of a key, when it was first seen, and its stored answer.
type Entry = (Bytes, std::time::Instant, Stored);

struct Server {
    breaks: Breaks,
    runs: AtomicU64,
    /// Per key: the first payload, and the stored answer.
    keys: Mutex<HashMap<String, Entry>>,
}

impl Server {
    async fn answer(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let mut key = header("idempotency-key").unwrap_or_default();
        if let Breaks::CaseInsensitive = self.breaks {
            key = key.to_ascii_lowercase();
        }
        let hold = header(HOLD_HEADER).and_then(|v| v.parse().ok());
        let fail = header("x-lab-fail").is_some();
        let body = req.into_body().collect().await.expect("body").to_bytes();
        if key.starts_with('"') != key.ends_with('"') || key.len() < 2 {
            return status(StatusCode::BAD_REQUEST);
        }
        let stored = {
            let mut keys = self.keys.lock().expect("not poisoned");
            let forgotten = keys.get(&key).is_some_and(|(_, seen, _)| {
                matches!(self.breaks, Breaks::ForgetsAfterOneSecond)
                    && seen.elapsed() > Duration::from_secs(1)
            });
            if forgotten {
                keys.remove(&key);
            }
            let (first, _, stored) = keys
                .entry(key)
                .or_insert_with(|| (body.clone(), std::time::Instant::now(), Stored::default()));
            if *first != body {
                return status(StatusCode::UNPROCESSABLE_ENTITY);
            }
            stored.clone()
        };
        let held = |hold: Option<u64>| async move {
            if let Some(ms) = hold {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
        };
        match self.breaks {
            Breaks::RunsThenInserts => {
                if stored.lock().await.is_none() {
                    self.runs.fetch_add(1, Ordering::SeqCst);
                    held(hold).await;
                    *stored.lock().await = Some((0, 200));
                }
                Response::new(Full::new(Bytes::from_static(b"{\"ok\":true}")))
            }
            Breaks::RerunsEveryRepeat => {
                self.runs.fetch_add(1, Ordering::SeqCst);
                held(hold).await;
                Response::new(Full::new(Bytes::from_static(b"{\"ok\":true}")))
            }
            _ => {
                let mut stored = match self.breaks {
                    Breaks::HoldsRepeats => stored.lock().await,
                    _ => match stored.try_lock() {
                        Ok(stored) => stored,
                        Err(_) => return status(StatusCode::CONFLICT),
                    },
                };
                let (run, code) = match *stored {
                    Some(answer) => answer,
                    None => {
                        let run = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
                        held(hold).await;
                        let code = if fail { 500 } else { 200 };
                        *stored = Some((run, code));
                        (run, code)
                    }
                };
                let mut res = Response::new(Full::new(Bytes::from(format!("{run}"))));
                *res.status_mut() = StatusCode::from_u16(code).expect("valid");
                res.headers_mut().insert(RUN_HEADER, run.into());
                res
            }
        }
    }
}

fn status(code: StatusCode) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(Bytes::new()));
    *res.status_mut() = code;
    res
}

async fn start(breaks: Breaks) -> (SocketAddr, Arc<Server>) {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = Arc::new(Server {
        breaks,
        runs: AtomicU64::new(0),
        keys: Mutex::default(),
    });
    let serving = server.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let server = serving.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| {
                    let server = server.clone();
                    async move { Ok::<_, Infallible>(server.answer(req).await) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, server)
}

fn check(addr: SocketAddr) -> KeysCheck {
    KeysCheck::new(&format!("http://{addr}"), "POST /v1/payments")
        .expect("valid check")
        .concurrency(4)
        .hold(Duration::from_millis(300))
}

/// A server that checks a key's syntax and payload but runs every repeat, answering alike
/// without a run header: the run-once rules could only be skipped "unverified", and the
/// check exited 0 on the two rules it passed. Issue 41 item 17, real SDKs through the lab.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_reruns_every_repeat_unobserved_is_not_passed() {
    let (addr, server) = start(Breaks::RerunsEveryRepeat).await;
    let report = check(addr).run().await;
    assert!(!report.passed(), "{report}");
    for rule in ["malformed-key-400", "other-payload-422"] {
        let result = report.rule(rule).expect("reported");
        assert_eq!(result.verdict, RuleVerdict::Pass, "{rule}: {report}");
    }
    for rule in [
        "in-flight-409",
        "repeat-same-answer",
        "concurrent-run-once",
        "repeat-after-failure",
    ] {
        let result = report.rule(rule).expect("reported");
        assert_eq!(result.verdict, RuleVerdict::Skip, "{rule}: {report}");
    }
    assert!(report.to_string().contains("not all verified"), "{report}");
    // The baseline, 2 in flight, the other payload's first, the repeat pair, 4 at once and
    // a repeat, the one that did not fail as asked, the two keys differing in case, the
    // first key sent again later: every request with a good key and its first payload ran.
    assert_eq!(server.runs.load(Ordering::SeqCst), 15, "{report}");
}

/// A server that holds a repeat until the key's first run ends and then gives it that
/// run's answer: it never answers 409, and the check took the held repeat for requests
/// that did not overlap (a skip) and passed. Issue 41 item 17, real SDKs through the lab.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_holds_a_repeat_instead_of_409_fails_the_in_flight_rule() {
    let (addr, _server) = start(Breaks::HoldsRepeats).await;
    let report = check(addr).run().await;
    let result = report.rule("in-flight-409").expect("reported");
    assert_eq!(result.verdict, RuleVerdict::Fail, "{report}");
    assert!(result.detail.contains("held"), "{}", result.detail);
    assert!(!report.passed(), "{report}");
    for rule in [
        "repeat-same-answer",
        "concurrent-run-once",
        "repeat-after-failure",
    ] {
        let result = report.rule(rule).expect("reported");
        assert_eq!(result.verdict, RuleVerdict::Pass, "{rule}: {report}");
    }
}

/// A server that takes `Key-A` and `key-a` for one key (the IETF draft makes the key a
/// Structured Field string: case matters): every other rule passed, and so did the check.
/// Issue 41 item 17, real SDKs through the lab.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_compares_keys_without_case_fails() {
    let (addr, _server) = start(Breaks::CaseInsensitive).await;
    let report = check(addr).run().await;
    let result = report.rule("key-case-sensitive").expect("reported");
    assert_eq!(result.verdict, RuleVerdict::Fail, "{report}");
    assert!(!report.passed(), "{report}");
    let failed: Vec<_> = report
        .results
        .iter()
        .filter(|r| r.verdict == RuleVerdict::Fail)
        .map(|r| r.rule)
        .collect();
    assert_eq!(failed, ["key-case-sensitive"], "{report}");
    // Without the rule, it would pass: every other rule does.
    assert_only_fails(&report, "key-case-sensitive");
}

/// Every rule but `rule` passes.
fn assert_only_fails(report: &retry_safety_lab::KeysReport, rule: &str) {
    for result in report.results.iter().filter(|r| r.rule != rule) {
        assert_eq!(
            result.verdict,
            RuleVerdict::Pass,
            "{}: {report}",
            result.rule
        );
    }
}

/// A server that forgets a key a second after it: every rule tried within the second
/// passed, and so did the check. Now the first key is sent again after `--keep-ms` (here
/// 1.5 s, at least; a slow machine only makes it later). Issue 41 item 17, real SDKs
/// through the lab.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_forgets_keys_after_a_second_fails() {
    let (addr, _server) = start(Breaks::ForgetsAfterOneSecond).await;
    let report = check(addr).keep(Duration::from_millis(1500)).run().await;
    let result = report.rule("key-kept").expect("reported");
    assert_eq!(result.verdict, RuleVerdict::Fail, "{report}");
    assert!(result.detail.contains("forgotten"), "{}", result.detail);
    assert!(!report.passed(), "{report}");
    assert_only_fails(&report, "key-kept");
}

/// A server that runs the handler and only then stores the key: requests at once with one
/// key each ran it (8 runs for one key in the review), equal answers without a run header made the rule "unverified", and
/// the check passed. Issue 41 item 17, real SDKs through the lab.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_runs_then_stores_the_key_is_not_passed() {
    let (addr, server) = start(Breaks::RunsThenInserts).await;
    let report = check(addr).run().await;
    assert!(!report.passed(), "{report}");
    let result = report.rule("concurrent-run-once").expect("reported");
    assert_ne!(result.verdict, RuleVerdict::Pass, "{report}");
    // How many of the burst ran depends on how many arrived within the hold (a loaded
    // machine may spread them): not counted here. The verdict does not depend on it.
    drop(server);
}
