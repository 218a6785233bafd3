//! Clients this project did not write, through the proxy: reqwest with reqwest-retry's
//! default transient policy, and a Python standard-library client that retries errors and
//! 5xx/429 as SDKs often do by hand. Their writes that failed after apply are applied twice,
//! exactly as the mix implies.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::time::Duration;

use retry_safety_lab::{Proxy, ProxyConfig, ProxyReport, Upstream};

use crate::stacks::payment_routes;

/// 2 operations per fault of the default mix, per kind.
const OPS: usize = 12;

async fn lab() -> (Upstream, Proxy) {
    let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let upstream = Upstream::start(loopback).await.expect("upstream");
    let config = ProxyConfig::new(&format!("http://{}", upstream.addr()))
        .expect("valid upstream")
        .routes(payment_routes())
        .slow(Duration::from_secs(20));
    let proxy = Proxy::start(config, loopback).await.expect("proxy");
    (upstream, proxy)
}

/// drop, slow and 503 after apply: 3 of the 6 faults, 2 operations each.
fn assert_naive_counts(report: &ProxyReport) {
    assert_eq!(report.writes(), OPS as u64, "{}", report.table(0));
    assert_eq!(report.applied_twice(), 6, "{}", report.table(0));
    assert_eq!(report.reads_recovered(), OPS as u64, "{}", report.table(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reqwest_retry_applies_every_write_that_failed_after_apply_twice() {
    let (_upstream, proxy) = lab().await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("a plain http client");
    let policy = reqwest_retry::policies::ExponentialBackoff::builder()
        .retry_bounds(Duration::from_millis(10), Duration::from_millis(50))
        .build_with_max_retries(3);
    let client = reqwest_middleware::ClientBuilder::new(client)
        .with(reqwest_retry::RetryTransientMiddleware::new_with_policy(
            policy,
        ))
        .build();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..OPS {
        let client = client.clone();
        let base = format!("http://{}", proxy.addr());
        tasks.spawn(async move {
            let write = client
                .post(format!("{base}/v1/payments"))
                .body(format!("{{\"ref\":\"op-{i}\"}}"))
                .send();
            let read = client.get(format!("{base}/v1/payments/{i}")).send();
            let (write, read) = tokio::join!(write, read);
            for res in [write, read].into_iter().flatten() {
                let _ = res.bytes().await;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    assert_naive_counts(&proxy.report());
}

/// Python's standard library, when `python3` is on the machine (the test says so and passes
/// when it is not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_client_that_retries_by_hand_applies_writes_twice() {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("python3 is not installed: the Python client was not tried");
        return;
    }
    let (_upstream, proxy) = lab().await;
    let script = r#"
import sys, urllib.request, urllib.error
base, ops = sys.argv[1], int(sys.argv[2])
def send(method, url, body):
    for attempt in range(4):
        req = urllib.request.Request(url, data=body, method=method)
        try:
            with urllib.request.urlopen(req, timeout=2) as res:
                res.read()
                return
        except urllib.error.HTTPError as err:
            if err.code < 500 and err.code != 429:
                return
        except Exception:
            pass
for i in range(ops):
    send("POST", base + "/v1/payments", ('{"ref":"op-%d"}' % i).encode())
    send("GET", base + "/v1/payments/%d" % i, None)
"#;
    let base = format!("http://{}", proxy.addr());
    let out = tokio::process::Command::new("python3")
        .args(["-c", script, &base, &OPS.to_string()])
        .output()
        .await
        .expect("python3 runs");
    assert!(out.status.success(), "{out:?}");
    assert_naive_counts(&proxy.report());
}
