//! Deadlines that cross hops, the client's half (issue 43): a call made inside a handler
//! inherits the deadline the handler's request arrived with, and never waits past it; a call
//! whose caller has already gone is not sent; the deadline and attempt number go on the wire
//! only to hosts that asked; a nested call whose caller retries makes the resends the policy
//! allows it. Real sockets on loopback; the servers count what reached them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use tower::{service_fn, Layer, ServiceExt};
use tower_retry_safety::deadline::{self, Inbound, ATTEMPT_HEADER, TIMEOUT_HEADER};
use tower_retry_safety::{RetryPolicy, RetryReport, StopReason};

use retry_safety_testing::fault_server::{Fault, FaultServer};
use retry_safety_testing::runtime_server::{accept, listener};

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

fn get(url: &str, fault: Fault, delay_ms: u64) -> Request<Full<Bytes>> {
    Request::get(url)
        .header("x-fault", fault.name())
        .header("x-handler-delay-ms", delay_ms.to_string())
        .body(Full::new(Bytes::new()))
        .expect("request")
}

/// Each request's headers, by path.
type SeenHeaders = Arc<Mutex<HashMap<String, Vec<HeaderMap>>>>;

/// A server on loopback that answers 200 and keeps each request's headers by path.
fn header_server() -> (std::net::SocketAddr, SeenHeaders) {
    let (socket, addr) = listener();
    let seen = Arc::new(Mutex::new(HashMap::<String, Vec<HeaderMap>>::new()));
    let kept = seen.clone();
    let svc = service_fn(move |req: Request<Incoming>| {
        let path = req.uri().path().to_owned();
        kept.lock()
            .expect("headers")
            .entry(path)
            .or_default()
            .push(req.headers().clone());
        async { Response::builder().body(Empty::<Bytes>::new()) }
    });
    tokio::spawn(accept(socket, svc));
    (addr, seen)
}

/// A nested call to a handler slower than the inbound deadline is cut at that deadline and
/// says so; the policy has no deadline of its own. Before: it waited the handler out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_call_is_cut_at_the_inbound_deadline() {
    let server = FaultServer::start().await;
    let policy = RetryPolicy::builder().no_budget().build().expect("policy");
    let svc = policy.layer(client());
    let url = server.url("slow-read");
    // The handler holds its answer far longer than the caller waits.
    let call = svc.oneshot(get(&url, Fault::None, 60_000));
    let inbound = Inbound::within(Duration::from_secs(1));
    let err = deadline::scope(inbound, call)
        .await
        .expect_err("cut at the inbound deadline");
    let report = err.report().expect("a report");
    assert_eq!(report.stop_reason(), StopReason::CallerDeadline, "{err}");
    assert_eq!(
        report.attempts(),
        1,
        "nothing is resent after the caller left"
    );
    assert!(server.stats("slow-read").attempts <= 1);
    assert!(
        Instant::now() < inbound.deadline() + Duration::from_secs(30),
        "it did not wait for the handler's answer"
    );
}

/// A call whose caller's deadline has already passed is not sent: the server sees nothing,
/// and the error says it was not applied. Before: it was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_caller_has_gone_is_not_sent() {
    let server = FaultServer::start().await;
    let policy = RetryPolicy::builder().no_budget().build().expect("policy");
    let svc = policy.layer(client());
    let url = server.url("gone-write");
    let req = Request::post(&url)
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("request");
    let gone = Inbound::at(Instant::now());
    let err = deadline::scope(gone, svc.oneshot(req))
        .await
        .expect_err("not sent");
    assert_eq!(
        err.report().map(RetryReport::stop_reason),
        Some(StopReason::CallerDeadline)
    );
    assert!(!err.may_have_been_applied(), "{err}");
    assert_eq!(server.stats("gone-write").attempts, 0);
    assert_eq!(server.applied("gone-write"), 0);
}

/// Outside a handler's scope, and with `inherit_deadline(None)`, nothing is inherited: the
/// same call is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_that_does_not_inherit_sends_the_call() {
    let server = FaultServer::start().await;
    let policy = RetryPolicy::builder()
        .inherit_deadline(None)
        .no_budget()
        .build()
        .expect("policy");
    let svc = policy.layer(client());
    let url = server.url("not-inherited");
    let gone = Inbound::at(Instant::now());
    let res = deadline::scope(gone, svc.oneshot(get(&url, Fault::None, 0)))
        .await
        .expect("sent");
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(server.stats("not-inherited").attempts, 1);
}

/// The deadline and the attempt number go to the host the policy names, never more time
/// than the client waits; another host gets neither. Before: no host got them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_headers_go_only_to_hosts_that_asked() {
    let (named, named_seen) = header_server();
    let (other, other_seen) = header_server();
    let policy = RetryPolicy::builder()
        .deadline(Duration::from_secs(5))
        .send_deadline_to(&format!("127.0.0.1:{}", named.port()))
        .no_budget()
        .build()
        .expect("policy");
    let svc = policy.layer(client());
    for addr in [named, other] {
        let req = Request::get(format!("http://{addr}/hop"))
            .body(Full::new(Bytes::new()))
            .expect("request");
        let res = svc.clone().oneshot(req).await.expect("a response");
        let _ = res.into_body().collect().await;
    }
    let named_seen = named_seen.lock().expect("headers");
    let headers = &named_seen["/hop"][0];
    let ms: u64 = headers[TIMEOUT_HEADER]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("milliseconds");
    assert!(ms <= 5_000, "never more than the client waits: {ms}");
    assert_eq!(headers[ATTEMPT_HEADER], "1");
    let other_seen = other_seen.lock().expect("headers");
    let headers = &other_seen["/hop"][0];
    assert!(headers.get(TIMEOUT_HEADER).is_none() && headers.get(ATTEMPT_HEADER).is_none());
}

/// Retry at one layer: a nested call whose caller retries makes the resends the policy
/// allows it (none here: its caller's retry covers the failure), while the same call from a
/// caller that does not retry is resent. The server answers the first attempt of each 500,
/// before applying anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_call_whose_caller_retries_makes_no_resends() {
    let server = FaultServer::start().await;
    let policy = RetryPolicy::builder()
        .max_retries(3)
        .backoff(Duration::from_millis(1), Duration::from_millis(2))
        .retries_when_caller_retries(0)
        .no_budget()
        .build()
        .expect("policy");
    let svc = policy.layer(client());
    let far = Duration::from_secs(120);
    let cases = [
        ("caller-retries", true, StatusCode::INTERNAL_SERVER_ERROR),
        ("caller-does-not", false, StatusCode::OK),
    ];
    for (op, caller_retries, status) in cases {
        let inbound = Inbound::within(far).with_caller_retries(caller_retries);
        let url = server.url(op);
        let req = get(&url, Fault::InternalErrorBeforeApply, 0);
        let res = deadline::scope(inbound, svc.clone().oneshot(req))
            .await
            .expect("a response");
        assert_eq!(res.status(), status, "{op}");
    }
    assert_eq!(server.stats("caller-retries").attempts, 1);
    assert_eq!(server.stats("caller-does-not").attempts, 2);
}
