//! One hop of the chain: a server on loopback behind this crate's server layers, whose
//! handler calls the next hop (A, B) or does the work (C, slow or failing on a schedule).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
use tower_idempotency_keys::deadline::DeadlineLayer;
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};
use tower_retry_safety::RetrySafety;

use crate::deadline_chain::Row;

pub type Body = BoxBody<Bytes, BoxError>;
pub type Outbound = RetrySafety<Client<HttpConnector, Full<Bytes>>>;
type Served = BoxCloneService<Request<Incoming>, Response<Body>, BoxError>;

/// The most a server gives a caller (and a request that names no deadline).
const SERVER_MAX: Duration = Duration::from_secs(5);
/// How long C holds a slow answer: past the SDK's deadline.
const SLOW: Duration = Duration::from_millis(700);
/// Attempts of a failing call that C's load shedder answers 503 (nothing done), each after a
/// while.
const FAILING_ATTEMPTS: u32 = 3;

/// What the hops share with the driver: each call's deadline (per attempt of a caller that
/// gives up on each attempt, as an SDK with a read timeout does), and what was counted.
#[derive(Default)]
pub struct Ledger {
    deadlines: Mutex<HashMap<(u32, u32), Instant>>,
    pub started_late: AtomicU32,
    pub attempts_at_c: AtomicU32,
    applied: Mutex<HashMap<u32, u32>>,
    tries_at_c: Mutex<HashMap<u32, u32>>,
    pub wasted_us: AtomicU64,
    pub running: AtomicU32,
    pub starts: AtomicU32,
}

impl Ledger {
    /// When the caller stops waiting for its attempt `attempt` (from 0) of `call`.
    pub fn set_deadline(&self, call: u32, attempt: u32, at: Instant) {
        self.deadlines
            .lock()
            .expect("ledger")
            .insert((call, attempt), at);
    }

    fn deadline(&self, call: u32, attempt: u32) -> Option<Instant> {
        self.deadlines
            .lock()
            .expect("ledger")
            .get(&(call, attempt))
            .copied()
    }

    pub fn applied_twice(&self) -> u32 {
        let applied = self.applied.lock().expect("ledger");
        applied.values().filter(|n| **n > 1).count() as u32
    }

    /// Counts an attempt of `call` at C: its number.
    fn try_at_c(&self, call: u32) -> u32 {
        let mut tries = self.tries_at_c.lock().expect("ledger");
        let n = tries.entry(call).or_default();
        *n += 1;
        *n
    }

    fn apply(&self, call: u32) {
        *self
            .applied
            .lock()
            .expect("ledger")
            .entry(call)
            .or_default() += 1;
    }

    /// A handler starts: counted, late if the caller of the call's attempt has gone.
    fn start(self: &Arc<Self>, (call, attempt): (u32, u32)) -> Running {
        let now = Instant::now();
        self.starts.fetch_add(1, Ordering::SeqCst);
        self.running.fetch_add(1, Ordering::SeqCst);
        let deadline = self.deadline(call, attempt);
        if deadline.is_some_and(|d| now > d) {
            self.started_late.fetch_add(1, Ordering::SeqCst);
        }
        Running {
            ledger: self.clone(),
            started: now,
            deadline,
        }
    }
}

/// A handler while it runs: at its end, the work done after the caller's deadline is counted.
struct Running {
    ledger: Arc<Ledger>,
    started: Instant,
    deadline: Option<Instant>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let end = Instant::now();
        if let Some(deadline) = self.deadline.filter(|d| end > *d) {
            let wasted = end - self.started.max(deadline);
            let us = u64::try_from(wasted.as_micros()).unwrap_or(u64::MAX);
            self.ledger.wasted_us.fetch_add(us, Ordering::SeqCst);
        }
        self.ledger.running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The call's number, from the `x-call` header.
fn call_of<B>(req: &Request<B>) -> u32 {
    number(req, "x-call").unwrap_or(u32::MAX)
}

/// The call and the originating caller's attempt (from 0: `x-sdk-attempt`, which every hop
/// passes on; the ledger's deadlines are kept per attempt).
fn attempt_of<B>(req: &Request<B>) -> (u32, u32) {
    (call_of(req), number(req, "x-sdk-attempt").unwrap_or(0))
}

fn number<B>(req: &Request<B>, name: &str) -> Option<u32> {
    req.headers().get(name)?.to_str().ok()?.parse().ok()
}

fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut res = Response::new(
        Full::new(Bytes::from_static(body.as_bytes()))
            .map_err(|e| match e {})
            .boxed(),
    );
    *res.status_mut() = status;
    res
}

/// C's work for one attempt of `call`: a write is applied, then (a slow call) the answer
/// waits.
async fn work(ledger: Arc<Ledger>, (call, attempt): (u32, u32), write: bool) -> Response<Body> {
    let _running = ledger.start((call, attempt));
    if write {
        ledger.apply(call);
    }
    if crate::deadline_chain::fault(call) == crate::deadline_chain::Fault::Slow {
        tokio::time::sleep(SLOW).await;
    }
    text(StatusCode::OK, "done")
}

/// A or B: the request, sent on to the next hop through the retry layer.
async fn forward<B>(
    ledger: Arc<Ledger>,
    outbound: Outbound,
    next: SocketAddr,
    req: Request<B>,
) -> Response<Body> {
    let (call, attempt) = attempt_of(&req);
    let _running = ledger.start((call, attempt));
    let mut out = Request::builder()
        .method(req.method().clone())
        .uri(format!("http://{next}/work"))
        .header("x-call", call)
        .header("x-sdk-attempt", attempt);
    if let Some(key) = req.headers().get("idempotency-key") {
        out = out.header("idempotency-key", key.clone());
    }
    let Ok(out) = out.body(Full::new(Bytes::from_static(b"{}"))) else {
        return text(StatusCode::INTERNAL_SERVER_ERROR, "bad request");
    };
    match outbound.oneshot(out).await {
        Ok(res) => {
            let status = res.status();
            let _ = res.into_body().collect().await;
            text(status, "from the next hop")
        }
        Err(_) => text(
            StatusCode::GATEWAY_TIMEOUT,
            "the next hop did not answer in time",
        ),
    }
}

/// Serves hop `next.is_none()` (C) or a forwarding hop on a fresh loopback port.
pub async fn serve(
    ledger: Arc<Ledger>,
    row: Row,
    next: Option<(SocketAddr, Outbound)>,
) -> Result<SocketAddr, BoxError> {
    let next_is_none = next.is_none();
    let handler = {
        let ledger = ledger.clone();
        service_fn(
            move |req: Request<http_body_util::Either<Full<Bytes>, Incoming>>| {
                let ledger = ledger.clone();
                let next = next.clone();
                async move {
                    let res = match next {
                        Some((addr, outbound)) => forward(ledger, outbound, addr, req).await,
                        None => {
                            let write = req.method() == http::Method::POST;
                            work(ledger, attempt_of(&req), write).await
                        }
                    };
                    Ok::<_, BoxError>(res)
                }
            },
        )
    };
    let keyed = ServiceBuilder::new()
        .map_response(boxed)
        .layer(IdempotencyLayer::new(MemoryStore::new()))
        .service(handler);
    let svc: Served = if row.deadlines() {
        BoxCloneService::new(
            ServiceBuilder::new()
                .map_response(boxed)
                .layer(DeadlineLayer::new(SERVER_MAX))
                .service(keyed),
        )
    } else {
        BoxCloneService::new(keyed)
    };
    let at_c = next_is_none;
    crate::loopback::serve(front(ledger, svc, at_c)).await
}

fn boxed<B>(res: Response<B>) -> Response<Body>
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    res.map(|body| body.map_err(|e| -> BoxError { e.into() }).boxed())
}

/// In front of C: the attempts that reached it are counted, and for a call whose fault is a
/// lost answer, the first answer is lost after the work was done (the connection closes
/// without it).
fn front(ledger: Arc<Ledger>, svc: Served, at_c: bool) -> Served {
    if !at_c {
        return svc;
    }
    let lost = Arc::new(Mutex::new(std::collections::HashSet::new()));
    BoxCloneService::new(service_fn(move |req: Request<Incoming>| {
        let (svc, ledger, lost) = (svc.clone(), ledger.clone(), lost.clone());
        async move {
            let call = call_of(&req);
            ledger.attempts_at_c.fetch_add(1, Ordering::SeqCst);
            // A load shedder in front of C: busy for the first attempts of a failing call.
            if crate::deadline_chain::fault(call) == crate::deadline_chain::Fault::Failing
                && ledger.try_at_c(call) <= FAILING_ATTEMPTS
            {
                tokio::time::sleep(Duration::from_millis(150)).await;
                return Ok(text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "busy: nothing was done",
                ));
            }
            let res = svc.oneshot(req).await?;
            let lose = crate::deadline_chain::fault(call) == crate::deadline_chain::Fault::Lost
                && lost.lock().expect("lost").insert(call);
            if lose {
                return Err(BoxError::from("the answer was lost (fault injected)"));
            }
            Ok::<_, BoxError>(res)
        }
    }))
}

/// A client through this crate's retry layer, with `policy`.
pub fn outbound(policy: tower_retry_safety::RetryPolicy) -> Outbound {
    ServiceBuilder::new()
        .layer(policy)
        .service(Client::builder(TokioExecutor::new()).build_http())
}
