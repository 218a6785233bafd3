//! Attribute values a caller chooses stay bounded (issue 41 item 9, the fifth review): a
//! `grpc.method` is a method the policy knows, else `other`; a host spelled many ways is one
//! `server.address`, as the reqwest adapter (whose URL parser writes hosts canonically) has it.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use tower::{service_fn, Layer, ServiceExt};
use tower_retry_safety::{Idempotency, RetryPolicy, RetryReport};

use super::{client, request, Meters};
use retry_safety_testing::fault_server::{Fault, FaultServer};
use retry_safety_testing::runtime_server::{accept, listener};

/// A server on loopback that answers every gRPC call trailers-only: UNAVAILABLE at a path's
/// first call, OK after; the calls per path are counted.
fn flaky_grpc_server() -> (std::net::SocketAddr, Arc<Mutex<HashMap<String, u32>>>) {
    let (socket, addr) = listener();
    let calls = Arc::new(Mutex::new(HashMap::<String, u32>::new()));
    let seen = calls.clone();
    let svc = service_fn(move |req: Request<Incoming>| {
        let mut calls = seen.lock().expect("calls");
        let n = calls.entry(req.uri().path().to_owned()).or_default();
        *n += 1;
        let status = if *n == 1 { "14" } else { "0" };
        async move {
            Response::builder()
                .header("content-type", "application/grpc")
                .header("grpc-status", status)
                .body(Empty::<bytes::Bytes>::new())
        }
    });
    tokio::spawn(accept(socket, svc));
    (addr, calls)
}

/// 64 invented method names give one `grpc.method` value, `other`; a method a route names
/// keeps its own. Before: 65 values (every path of gRPC's shape was its own value).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invented_grpc_methods_are_recorded_as_other() {
    let (addr, calls) = flaky_grpc_server();
    let meters = Meters::new();
    let policy = RetryPolicy::builder()
        .backoff(
            std::time::Duration::from_millis(1),
            std::time::Duration::from_millis(2),
        )
        .route(Method::POST, "/lab.v1.Ledger/Get", Idempotency::Idempotent)
        .meter(meters.meter())
        .no_budget()
        .build()
        .expect("policy");
    let svc = policy.layer(client());
    let paths = (0..64)
        .map(|i| format!("/invented.v{i}.Svc/Method{i}"))
        .chain(["/lab.v1.Ledger/Get".to_owned()]);
    for path in paths {
        let mut req = Request::post(format!("http://{addr}{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(Full::new(bytes::Bytes::new()))
            .expect("request");
        req.extensions_mut().insert(Idempotency::Idempotent);
        let res = svc.clone().oneshot(req).await.expect("a response");
        let attempts = RetryReport::of(&res).map(RetryReport::attempts);
        assert_eq!(attempts, Some(2), "{path}: one UNAVAILABLE, then OK");
        let _ = res.into_body().collect().await;
    }
    assert_eq!(
        calls.lock().expect("calls").len(),
        65,
        "every call reached the server"
    );
    let got = meters.read();
    let points = got.u64_histogram_points("grpc.client.call.retries");
    let methods: BTreeSet<String> = points
        .iter()
        .map(|(a, _)| a["grpc.method"].clone())
        .collect();
    assert_eq!(
        methods,
        BTreeSet::from(["lab.v1.Ledger/Get".to_owned(), "other".to_owned()])
    );
    assert_eq!(got.u64_histogram("grpc.client.call.retries"), (65, 65));
}

/// One host written seven ways, each reaching the same server on loopback through the tower
/// layer, is one `server.address` value. Before: seven.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_host_spelled_seven_ways_is_one_server_address() {
    let server = FaultServer::start().await;
    let port = server.addr().port();
    let meters = Meters::new();
    let svc = metered(&meters);
    let spellings = [
        "127.0.0.1",
        "127.1",
        "0x7f.0.0.1",
        "2130706433",
        "0177.0.0.1",
        "127.0.0.01",
        "127.000.000.001",
    ];
    for (i, host) in spellings.iter().enumerate() {
        let url = format!("http://{host}:{port}/ops/spelling-{i}");
        let res = svc
            .clone()
            .oneshot(request(Method::GET, &url, Fault::None))
            .await
            .unwrap_or_else(|e| panic!("{host}: {e}"));
        assert!(res.status().is_success(), "{host}: {}", res.status());
        let _ = res.into_body().collect().await;
    }
    let reached: u32 = (0..spellings.len())
        .map(|i| server.stats(&format!("spelling-{i}")).attempts)
        .sum();
    assert_eq!(reached, 7, "each spelling reached the server");
    let got = meters.read();
    assert_eq!(addresses(&got), BTreeSet::from(["127.0.0.1".to_owned()]));
    assert_eq!(got.u64_histogram("retry_safety.client.attempts"), (7, 7));
}

/// More spellings of one host than the kept sets (16), then another host: one value per
/// host, however many spellings came first (the adversarial review of issue 41).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spellings_past_the_kept_sets_stay_one_server_address() {
    let server = FaultServer::start().await;
    let port = server.addr().port();
    let meters = Meters::new();
    let svc = metered(&meters);
    let spellings = [
        "127.0.0.1",
        "127.1",
        "0x7f.0.0.1",
        "2130706433",
        "0177.0.0.1",
        "127.0.0.01",
        "127.000.000.001",
        "0x7F.1",
        "127.0.0.1.",
        "0x7f000001",
        "017700000001",
        "127.0.1",
        "0x7f.0x0.0x0.0x1",
        "127.0x0.0.1",
        "0x7f.1.",
        "127.00.0.1",
        "127.0.00.1",
        "127.0.0.001",
        "0x07f.1",
        "0x0000007f.1",
        "localhost",
    ];
    for (i, host) in spellings.iter().enumerate() {
        let url = format!("http://{host}:{port}/ops/spelling-{i}");
        // A spelling the resolver refuses ends not sent; it is counted all the same.
        if let Ok(res) = svc
            .clone()
            .oneshot(request(Method::GET, &url, Fault::None))
            .await
        {
            let _ = res.into_body().collect().await;
        }
    }
    let got = meters.read();
    assert_eq!(
        addresses(&got),
        BTreeSet::from(["127.0.0.1".to_owned(), "localhost".to_owned()])
    );
}

/// The `server.address` values the attempts histogram was recorded with.
fn addresses(got: &super::Recorded) -> BTreeSet<String> {
    got.u64_histogram_points("retry_safety.client.attempts")
        .iter()
        .map(|(a, _)| a.get("server.address").cloned().unwrap_or_default())
        .collect()
}

/// The tower layer over the loopback client, recording in `meters`.
fn metered(
    meters: &Meters,
) -> impl tower::Service<
    http::Request<http_body_util::Full<bytes::Bytes>>,
    Response = http::Response<hyper::body::Incoming>,
    Error = tower_retry_safety::Error,
    Future = impl Send,
> + Clone {
    let policy = RetryPolicy::builder()
        .meter(meters.meter())
        .no_budget()
        .build()
        .expect("policy");
    policy.layer(client())
}
