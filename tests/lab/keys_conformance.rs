//! The key conformance check: every rule passes against this crate's `IdempotencyLayer`, and
//! a server that ignores keys is reported rule by rule.

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower_retry_safety::lab::{KeysCheck, Outcome, Upstream, HOLD_HEADER, RUN_HEADER};

fn loopback() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, 0))
}

const RULES: [&str; 6] = [
    "malformed-key-400",
    "in-flight-409",
    "other-payload-422",
    "repeat-same-answer",
    "concurrent-run-once",
    "repeat-after-failure",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crates_layer_over_the_memory_store_passes_every_rule() {
    let upstream = Upstream::start(loopback()).await.expect("upstream");
    let check = KeysCheck::new(&format!("http://{}", upstream.addr()), "POST /v1/payments")
        .expect("valid check");
    let report = check.run().await;
    for rule in RULES {
        let result = report.rule(rule).expect("every rule is reported");
        assert_eq!(result.outcome, Outcome::Pass, "{report}");
    }
    assert!(report.passed(), "{report}");
    // The handler ran: once for the in-flight pair, the other payload's first, the stored
    // response's first, the concurrent burst, and the failed run; never for a repeat.
    assert_eq!(upstream.handler_runs(), 5, "{report}");
    // The documented answer after a failed handler: the stored stand-in.
    let after = report.rule("repeat-after-failure").expect("reported");
    assert!(after.detail.contains("500"), "{}", after.detail);
    assert!(
        after.detail.contains("x-should-retry: false"),
        "{}",
        after.detail
    );
}

/// A server that ignores keys: every request runs the handler, whose run number it echoes.
async fn start_keyless_server() -> SocketAddr {
    let listener = TcpListener::bind(loopback()).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let runs = Arc::new(AtomicU64::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let runs = runs.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let runs = runs.clone();
                    async move {
                        let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                        let hold = req
                            .headers()
                            .get(HOLD_HEADER)
                            .and_then(|v| v.to_str().ok()?.parse().ok())
                            .map(Duration::from_millis);
                        let _ = req.into_body().collect().await;
                        if let Some(hold) = hold {
                            tokio::time::sleep(hold).await;
                        }
                        let mut res = Response::new(Full::new(Bytes::from(format!("{run}"))));
                        res.headers_mut().insert(RUN_HEADER, run.into());
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
        assert_eq!(result.outcome, Outcome::Fail, "{rule}: {report}");
    }
    // It does not fail on request, so the rule cannot be tried.
    let after = report.rule("repeat-after-failure").expect("reported");
    assert_eq!(after.outcome, Outcome::Skip, "{report}");
    let text = report.to_string();
    assert_eq!(text.lines().count(), RULES.len(), "{text}");
    assert_eq!(text.lines().filter(|l| l.starts_with("FAIL")).count(), 5);
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
