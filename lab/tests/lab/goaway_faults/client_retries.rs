//! The GOAWAY faults through real HTTP clients, one operation at a time: tower-retry-safety's layer
//! over HTTP/2 resends no write after either GOAWAY (reads recover), a typical `tower::retry`
//! applies each `goaway-after-apply` write twice, and HTTP/1.1 clients get the faults as the
//! connection-close faults, with the same counts.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retry_safety_lab::{Fault, Proxy, ProxyReport, RouteCounts, Upstream};

use crate::stacks::TypicalPolicy;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_retry_safety::RetryPolicy;

use super::{h2_client, loopback, proxy, HttpClient, PER_ATTEMPT};
use crate::raw_upstream::GUARD;

fn h1_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

fn policy() -> RetryPolicy {
    RetryPolicy::builder()
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .lock_free_budget(Duration::from_secs(10), 100, 1.0)
        .attempt_timeout(PER_ATTEMPT)
        .build()
        .expect("valid policy")
}

/// What a client got for `ops` writes and `ops` reads.
#[derive(Debug, PartialEq, Eq)]
struct Got {
    writes_ok: usize,
    reads_ok: usize,
    /// Writes whose error came from a remote GOAWAY that left their stream out (h2 fails the
    /// streams above its last-stream-id with it).
    writes_left_out: usize,
}

fn remote_goaway(err: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(err), |&e| e.source())
        .filter_map(|e| e.downcast_ref::<h2::Error>())
        .any(|e| e.is_remote() && e.is_go_away())
}

/// `ops` writes and reads, one operation at a time, through `svc`: each first attempt meets
/// its fault alone on its connection.
async fn one_at_a_time<S, B>(svc: S, base: &str, ops: usize) -> Got
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>> + Clone,
    S::Error: Into<tower_retry_safety::BoxError>,
    B: http_body::Body,
{
    let mut got = Got {
        writes_ok: 0,
        reads_ok: 0,
        writes_left_out: 0,
    };
    for i in 0..ops {
        let write = Request::post(format!("{base}/v1/payments"))
            .body(Full::new(Bytes::from(format!("{{\"ref\":\"op-{i}\"}}"))))
            .expect("valid request");
        let read = Request::get(format!("{base}/v1/payments/{i}"))
            .body(Full::new(Bytes::new()))
            .expect("valid request");
        for (req, write) in [(write, true), (read, false)] {
            let res = tokio::time::timeout(GUARD, svc.clone().oneshot(req))
                .await
                .expect("an outcome");
            match res {
                Ok(res) => {
                    if res.status().is_success() {
                        *(if write {
                            &mut got.writes_ok
                        } else {
                            &mut got.reads_ok
                        }) += 1;
                    }
                    let _ = res.into_body().collect().await;
                }
                Err(err) => {
                    let err: tower_retry_safety::BoxError = err.into();
                    if write && remote_goaway(&*err) {
                        got.writes_left_out += 1;
                    }
                }
            }
        }
    }
    got
}

/// Operations per kind in the client tests.
const OPS: usize = 6;

/// A fresh upstream and proxy with one fault; the upstream and the proxy's base URL.
async fn lab(fault: Fault) -> (Upstream, Proxy, String) {
    let upstream = Upstream::start(loopback()).await.expect("upstream");
    let proxy = proxy(&format!("http://{}", upstream.addr()), vec![fault]).await;
    let base = format!("http://{}", proxy.addr());
    (upstream, proxy, base)
}

fn write_row(report: &ProxyReport) -> RouteCounts {
    report
        .routes()
        .iter()
        .find(|r| r.route == "POST /v1/payments")
        .expect("a write row")
        .clone()
}

/// A remote GOAWAY is ambiguous to tower-retry-safety's classifier (hyper can hand one to a request it
/// already wrote), so its layer resends neither fault's writes, and reads recover. After
/// `goaway-before-forwarding` the upstream never saw the writes; after `goaway-after-apply`
/// it ran each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_crates_layer_over_h2_applies_no_write_twice_after_either_goaway() {
    let svc = || ServiceBuilder::new().layer(policy()).service(h2_client());

    let (upstream, proxy, base) = lab(Fault::GoAwayBeforeForwarding).await;
    let got = one_at_a_time(svc(), &base, OPS).await;
    // hyper's h2 client failed each write's stream as left out by the GOAWAY.
    let expected = Got {
        writes_ok: 0,
        reads_ok: OPS,
        writes_left_out: OPS,
    };
    assert_eq!(got, expected);
    let report = proxy.report();
    assert_eq!(report.applied_twice(), 0, "{}", report.table(0));
    assert_eq!(report.reads_recovered(), OPS as u64);
    let row = write_row(&report);
    assert_eq!(row.upstream_requests, 0);
    assert_eq!(row.failed_provably_unsent, OPS as u64);
    // The reads' resends only.
    assert_eq!(upstream.handler_runs(), OPS as u64);

    let (upstream, proxy, base) = lab(Fault::GoAwayAfterApply).await;
    let got = one_at_a_time(svc(), &base, OPS).await;
    // The GOAWAY covered each write's stream, which failed when the connection closed.
    let expected = Got {
        writes_ok: 0,
        reads_ok: OPS,
        writes_left_out: 0,
    };
    assert_eq!(got, expected);
    let report = proxy.report();
    assert_eq!(report.applied_twice(), 0, "{}", report.table(0));
    assert_eq!(report.reads_recovered(), OPS as u64);
    let row = write_row(&report);
    assert_eq!(row.upstream_requests, OPS as u64);
    assert_eq!(row.failed_after_upstream, OPS as u64);
    // Each write once, each read twice.
    assert_eq!(upstream.handler_runs(), 3 * OPS as u64);
}

/// The control: a retry-everything `tower::retry` over the same HTTP/2 client resends every
/// write, which applies each `goaway-after-apply` write twice, and each
/// `goaway-before-forwarding` write once (the first attempt never reached the upstream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typical_tower_retry_over_h2_applies_goaway_after_apply_writes_twice() {
    let svc = || {
        ServiceBuilder::new()
            .retry(TypicalPolicy::new(3))
            .timeout(PER_ATTEMPT)
            .service(h2_client())
    };

    let all_ok = Got {
        writes_ok: OPS,
        reads_ok: OPS,
        writes_left_out: 0,
    };
    let (upstream, proxy, base) = lab(Fault::GoAwayAfterApply).await;
    assert_eq!(one_at_a_time(svc(), &base, OPS).await, all_ok);
    let report = proxy.report();
    assert_eq!(report.applied_twice(), OPS as u64, "{}", report.table(0));
    assert_eq!(write_row(&report).upstream_requests, 2 * OPS as u64);
    assert_eq!(upstream.handler_runs(), 4 * OPS as u64);

    let (upstream, proxy, base) = lab(Fault::GoAwayBeforeForwarding).await;
    assert_eq!(one_at_a_time(svc(), &base, OPS).await, all_ok);
    let report = proxy.report();
    assert_eq!(report.applied_twice(), 0, "{}", report.table(0));
    assert_eq!(write_row(&report).upstream_requests, OPS as u64);
    assert_eq!(upstream.handler_runs(), 2 * OPS as u64);
}

/// HTTP/1.1 has no GOAWAY: the faults close the connection as `reset-before-forwarding` and
/// `drop-after-apply` do, and the proxy's counts are the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http1_client_gets_the_goaway_faults_as_connection_closes() {
    let svc = || {
        ServiceBuilder::new()
            .retry(TypicalPolicy::new(3))
            .timeout(PER_ATTEMPT)
            .service(h1_client())
    };
    for (goaway, twin, applied_twice) in [
        (
            Fault::GoAwayBeforeForwarding,
            Fault::ResetBeforeForwarding,
            0,
        ),
        (Fault::GoAwayAfterApply, Fault::DropAfterApply, OPS as u64),
    ] {
        let mut seen = Vec::new();
        for fault in [goaway, twin] {
            let (upstream, proxy, base) = lab(fault).await;
            let got = one_at_a_time(svc(), &base, OPS).await;
            assert_eq!((got.writes_ok, got.reads_ok), (OPS, OPS));
            let report = proxy.report();
            assert_eq!(report.applied_twice(), applied_twice, "{}", report.table(0));
            seen.push((report.to_json(0), upstream.handler_runs()));
        }
        assert_eq!(seen[0], seen[1], "{goaway:?} against {twin:?}");
    }
}
