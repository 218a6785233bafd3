//! The stacks the hedging tests drive: a scripted inner service on paused tokio time for the
//! timing logic, and a hyper client, requests and eager hedging policies against the fault
//! server on 127.0.0.1, which counts side effects.
//!
//! Written for the adversarial review of safe hedging and the per-attempt spans (issue 25).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::fault_server::{Fault, FaultServer};
use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_retry_safety::service::attempt_number;
use tower_retry_safety::{Hedge, RetryPolicy, RetryReport};

// ---------------------------------------------------------------------------------------------
// Scripted inner service on paused time.

/// How attempt n (from 1) ends: after this many ms, with this status and Retry-After seconds
/// (`None` status: an error that says nothing about whether it was sent).
pub type Script = fn(u32) -> (u64, Option<u16>, Option<u64>);

#[derive(Clone, Default)]
pub struct Seen {
    pub calls: Arc<AtomicU32>,
    /// When each call was made (paused clock, ms since the request started).
    pub at: Arc<Mutex<Vec<u128>>>,
    /// `attempt_number` each call saw.
    pub numbers: Arc<Mutex<Vec<Option<u32>>>>,
    /// Futures dropped before they completed.
    pub cancelled: Arc<AtomicU32>,
}

pub struct Guard {
    pub done: bool,
    pub cancelled: Arc<AtomicU32>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.done {
            self.cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

pub type Fut = Pin<Box<dyn Future<Output = Result<Response<String>, std::io::Error>> + Send>>;

pub fn scripted(
    seen: &Seen,
    script: Script,
) -> impl Service<Request<String>, Response = Response<String>, Error = std::io::Error, Future = Fut>
       + Clone
       + use<> {
    let seen = seen.clone();
    let t0 = tokio::time::Instant::now();
    service_fn(move |req: Request<String>| {
        let n = seen.calls.fetch_add(1, Ordering::SeqCst) + 1;
        seen.at.lock().unwrap().push(t0.elapsed().as_millis());
        seen.numbers
            .lock()
            .unwrap()
            .push(attempt_number(req.extensions()));
        let guard = Guard {
            done: false,
            cancelled: seen.cancelled.clone(),
        };
        let fut: Fut = Box::pin(async move {
            // Moved in whole (not only its field), so dropping the future drops it.
            let mut guard = guard;
            let (ms, status, retry_after) = script(n);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            guard.done = true;
            match status {
                Some(s) => {
                    let mut res = Response::builder().status(s);
                    if let Some(secs) = retry_after {
                        res = res.header("retry-after", secs.to_string());
                    }
                    Ok(res.body(format!("attempt {n}")).unwrap())
                }
                None => Err(std::io::Error::other("dropped")),
            }
        });
        fut
    })
}

pub async fn run(
    policy: &RetryPolicy,
    req: Request<String>,
    script: Script,
) -> (Result<Response<String>, tower_retry_safety::Error>, Seen) {
    let seen = Seen::default();
    let svc = policy.layer(scripted(&seen, script));
    (svc.oneshot(req).await, seen)
}

pub fn get() -> Request<String> {
    Request::get("http://api.example/items")
        .body(String::new())
        .unwrap()
}

pub fn report(res: &Response<String>) -> &RetryReport {
    RetryReport::of(res).expect("the layer adds a report")
}

pub fn fast(_: u32) -> (u64, Option<u16>, Option<u64>) {
    (1, Some(200), None)
}

// ---------------------------------------------------------------------------------------------
// Never twice, on loopback.

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

pub fn loopback_req(
    server: &FaultServer,
    method: Method,
    op: &str,
    delay_ms: u64,
) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(server.url(op))
        .header("x-handler-delay-ms", delay_ms.to_string())
        .body(Full::new(Bytes::from_static(b"{\"amount\":1}")))
        .unwrap()
}

pub async fn send(
    policy: &RetryPolicy,
    req: Request<Full<Bytes>>,
) -> Result<(Response<Bytes>, RetryReport), tower_retry_safety::Error> {
    let res = policy.layer(client()).oneshot(req).await?;
    let report = RetryReport::of(&res).cloned().expect("a report");
    let (parts, body) = res.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Ok((Response::from_parts(parts, body), report))
}

pub fn hedging(hedge: Hedge) -> tower_retry_safety::RetryPolicyBuilder {
    RetryPolicy::builder()
        .hedge(hedge)
        .max_retries(10)
        .no_budget()
}

pub fn eager() -> Hedge {
    Hedge::fixed(Duration::from_millis(20))
        .max_extra_load(1.0)
        .max_hedges(10)
        .keyed_writes(true)
}

/// Operation `i` on the heavy-tailed loopback: slow (50 ms) when `i.is_multiple_of(20)`, else 1 ms, after applying.
pub fn heavy_tail_request(
    server: &FaultServer,
    method: Method,
    op: &str,
    i: u32,
) -> Request<Full<Bytes>> {
    let delay = if i.is_multiple_of(20) { "50" } else { "1" };
    Request::builder()
        .method(method)
        .uri(server.url(op))
        .header("x-fault", Fault::None.name())
        .header("x-handler-delay-ms", delay)
        .body(Full::new(Bytes::from_static(b"{\"amount\":1}")))
        .unwrap()
}

/// Sends `req` and reads the body; the report, or `None` for a service without the layer.
pub async fn send_and_read<S, E>(svc: &mut S, req: Request<Full<Bytes>>) -> Option<RetryReport>
where
    S: Service<Request<Full<Bytes>>, Response = Response<hyper::body::Incoming>, Error = E>,
    E: std::fmt::Debug,
{
    let res = svc.ready().await.unwrap().call(req).await.unwrap();
    let report = RetryReport::of(&res).cloned();
    res.into_body().collect().await.unwrap();
    report
}
