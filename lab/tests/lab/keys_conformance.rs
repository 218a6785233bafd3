//! The key conformance check: every rule passes against tower-idempotency-keys'
//! `IdempotencyLayer`, and a server that ignores keys is reported rule by rule.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use retry_safety_lab::headers::{HOLD_HEADER, RUN_HEADER};
use retry_safety_lab::{KeysCheck, RuleVerdict, Upstream};
use tokio::net::TcpListener;

fn loopback() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, 0))
}

const RULES: [&str; 8] = [
    "malformed-key-400",
    "in-flight-409",
    "other-payload-422",
    "repeat-same-answer",
    "concurrent-run-once",
    "repeat-after-failure",
    "key-case-sensitive",
    "key-kept",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crates_layer_over_the_memory_store_passes_every_rule() {
    let upstream = Upstream::start(loopback()).await.expect("upstream");
    let check = KeysCheck::new(&format!("http://{}", upstream.addr()), "POST /v1/payments")
        .expect("valid check");
    let report = check.run().await;
    for rule in RULES {
        let result = report.rule(rule).expect("every rule is reported");
        assert_eq!(result.verdict, RuleVerdict::Pass, "{report}");
    }
    assert!(report.passed(), "{report}");
    // The handler ran: once for the baseline request, the in-flight pair, the other
    // payload's first, the stored response's first, the concurrent burst, the failed run,
    // and each of the two keys differing in case; never for a repeat.
    assert_eq!(upstream.handler_runs(), 8, "{report}");
    // The documented answer after a failed handler: the stored stand-in.
    let after = report.rule("repeat-after-failure").expect("reported");
    assert!(after.detail.contains("500"), "{}", after.detail);
    assert!(
        after.detail.contains("x-should-retry: false"),
        "{}",
        after.detail
    );
}

/// How a stand-in server that honours no key answers every request.
#[derive(Clone, Copy)]
enum Answers {
    /// 200, its run's number in the body and in the run header.
    RunNumbered,
    /// 200 with one constant body and no run header: runs cannot be told apart.
    Constant,
    /// 400, as a server that refuses the check's payload.
    BadRequest,
    /// 200 from the first run with the request's key, at once (no hold): a repeat gets the
    /// first run's number again.
    OneRunPerKey,
}

/// A server that ignores keys: every request runs the handler, whose run number it echoes.
async fn start_keyless_server() -> SocketAddr {
    start_server(Answers::RunNumbered).await
}

/// A server that ignores keys and answers every request as `answers` says.
async fn start_server(answers: Answers) -> SocketAddr {
    let listener = TcpListener::bind(loopback()).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let runs = Arc::new(AtomicU64::new(0));
    let by_key: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (runs, by_key) = (runs.clone(), by_key.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let (runs, by_key) = (runs.clone(), by_key.clone());
                    async move {
                        let key = req
                            .headers()
                            .get("idempotency-key")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_owned();
                        let run = match answers {
                            Answers::OneRunPerKey => *by_key
                                .lock()
                                .expect("not poisoned")
                                .entry(key)
                                .or_insert_with(|| runs.fetch_add(1, Ordering::SeqCst) + 1),
                            _ => runs.fetch_add(1, Ordering::SeqCst) + 1,
                        };
                        let hold = req
                            .headers()
                            .get(HOLD_HEADER)
                            .and_then(|v| v.to_str().ok()?.parse().ok())
                            .map(Duration::from_millis);
                        let _ = req.into_body().collect().await;
                        let hold = hold.filter(|_| !matches!(answers, Answers::OneRunPerKey));
                        if let Some(hold) = hold {
                            tokio::time::sleep(hold).await;
                        }
                        let res = match answers {
                            Answers::RunNumbered | Answers::OneRunPerKey => {
                                let mut res =
                                    Response::new(Full::new(Bytes::from(format!("{run}"))));
                                res.headers_mut().insert(RUN_HEADER, run.into());
                                res
                            }
                            Answers::Constant => {
                                Response::new(Full::new(Bytes::from_static(b"{\"ok\":true}")))
                            }
                            Answers::BadRequest => {
                                let mut res = Response::new(Full::new(Bytes::from_static(
                                    b"{\"error\":\"unknown field lab\"}",
                                )));
                                *res.status_mut() = http::StatusCode::BAD_REQUEST;
                                res
                            }
                        };
                        Ok::<_, Infallible>(res)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_ignores_keys_fails_each_rule_it_breaks() {
    let addr = start_keyless_server().await;
    let report = KeysCheck::new(&format!("http://{addr}"), "POST /v1/payments/{id}")
        .expect("valid check")
        .concurrency(4)
        .hold(Duration::from_millis(300))
        .run()
        .await;
    assert!(!report.passed(), "{report}");
    for rule in &RULES[..5] {
        let result = report.rule(rule).expect("reported");
        assert_eq!(result.verdict, RuleVerdict::Fail, "{rule}: {report}");
    }
    // It does not fail on request, so the rule cannot be tried.
    let after = report.rule("repeat-after-failure").expect("reported");
    assert_eq!(after.verdict, RuleVerdict::Skip, "{report}");
    let text = report.to_string();
    assert_eq!(text.lines().count(), RULES.len(), "{text}");
    // And the first key, sent again later, runs again: forgotten.
    let kept = report.rule("key-kept").expect("reported");
    assert_eq!(kept.verdict, RuleVerdict::Fail, "{report}");
    assert_eq!(text.lines().filter(|l| l.starts_with("FAIL")).count(), 6);
}

/// Equal answers without a run header cannot tell a stored response from a second run: the rules that
/// would need that are not passed, and the rules it breaks outright fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_ignores_keys_without_a_run_header_is_not_passed() {
    let addr = start_server(Answers::Constant).await;
    let report = KeysCheck::new(&format!("http://{addr}"), "POST /v1/payments")
        .expect("valid check")
        .concurrency(4)
        .hold(Duration::from_millis(300))
        .run()
        .await;
    assert!(!report.passed(), "{report}");
    for rule in RULES {
        let result = report.rule(rule).expect("reported");
        assert_ne!(result.verdict, RuleVerdict::Pass, "{rule}: {report}");
    }
    for rule in ["malformed-key-400", "other-payload-422"] {
        assert_eq!(
            report.rule(rule).expect("reported").verdict,
            RuleVerdict::Fail,
            "{report}"
        );
    }
    for rule in ["in-flight-409", "repeat-same-answer", "concurrent-run-once"] {
        let result = report.rule(rule).expect("reported");
        assert_eq!(result.verdict, RuleVerdict::Skip, "{rule}: {report}");
        assert!(result.detail.contains(RUN_HEADER), "{}", result.detail);
    }
}

/// A route that refuses the check's own request lets no rule be tried: all skip, none pass,
/// and the check as a whole does not pass (it verified nothing: the command exits 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_that_refuses_the_checks_payload_gets_skips_not_passes() {
    let addr = start_server(Answers::BadRequest).await;
    let report = KeysCheck::new(&format!("http://{addr}"), "POST /v1/payments")
        .expect("valid check")
        .run()
        .await;
    assert!(!report.passed(), "{report}");
    assert!(
        report.to_string().ends_with("nothing was verified\n"),
        "{report}"
    );
    assert_eq!(report.results.len(), RULES.len());
    for rule in RULES {
        let result = report.rule(rule).expect("reported");
        assert_eq!(result.verdict, RuleVerdict::Skip, "{rule}: {report}");
        assert!(
            result.detail.contains("refused the check's request"),
            "{}",
            result.detail
        );
    }
}

/// A server whose handler ignores the hold answers both requests from one run: they did not
/// overlap, and the rule is not tried rather than failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_did_not_overlap_skip_the_in_flight_rule() {
    let addr = start_server(Answers::OneRunPerKey).await;
    let report = KeysCheck::new(&format!("http://{addr}"), "POST /v1/payments")
        .expect("valid check")
        .run()
        .await;
    let result = report.rule("in-flight-409").expect("reported");
    assert_eq!(result.verdict, RuleVerdict::Skip, "{report}");
    assert!(
        result.detail.contains("did not overlap"),
        "{}",
        result.detail
    );
}

#[test]
fn a_bad_target_or_route_is_refused_naming_the_flag() {
    let err = KeysCheck::new("ftp://127.0.0.1:1", "POST /v1/x").unwrap_err();
    assert_eq!(err.input(), "--target");
    let err = KeysCheck::new("http://127.0.0.1:1", "POST").unwrap_err();
    assert_eq!(err.input(), "--route");
    let err = KeysCheck::new("http://127.0.0.1:1", "POST v1").unwrap_err();
    assert_eq!(err.input(), "--route");
}

/// A `--target` with a query (`?api_key=...`, a credential as some APIs take it) or a path
/// is refused, not echoed: the check sends neither (the route gives the path), and the
/// check's `Debug` showed the whole URL. Found by review of the keys check's --header/--body.
#[test]
fn a_target_with_a_query_or_path_is_refused_without_echoing_it() {
    for target in [
        "http://127.0.0.1:1/?api_key=s3cret-token",
        "http://127.0.0.1:1/api/s3cret-token",
    ] {
        let err = KeysCheck::new(target, "POST /v1/x").expect_err(target);
        assert_eq!(err.input(), "--target", "{target}");
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains("s3cret"), "{target}: {shown}");
    }
    for target in ["http://127.0.0.1:1", "http://127.0.0.1:1/"] {
        let check = KeysCheck::new(target, "POST /v1/x").expect(target);
        assert!(format!("{check:?}").contains("127.0.0.1:1"), "{target}");
    }
}
