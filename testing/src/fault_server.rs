//! A real hyper server on 127.0.0.1 that counts side effects per operation and injects one
//! fault into each operation's first attempt. Shared by the client's and the server's tests
//! and the examples, so every claim is measured against the same faults.
//!
//! Protocol: `METHOD /ops/{op}` (or any other path, which is then the op) with an `x-fault`
//! header naming the fault for the op's first attempt. Non-GET requests "apply" a side effect
//! (a counter per op). GETs read.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tower::BoxError;

use crate::keys::Keys;

type Body = BoxBody<Bytes, BoxError>;

/// What happens to an operation's first attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// Applied, answered 200.
    None,
    /// Applied, then the connection is closed without a response.
    DropAfterApply,
    /// Applied, then the response is held for `SLOW` (past any client per-attempt timeout).
    SlowAfterApply,
    /// Applied, answered 503.
    UnavailableAfterApply,
    /// Not applied, answered 429 with `Retry-After: 0`.
    TooManyRequestsBeforeApply,
    /// Not applied, answered 500.
    InternalErrorBeforeApply,
}

/// How long a slow response is held.
pub const SLOW: Duration = Duration::from_millis(800);

impl Fault {
    pub const ALL: [Fault; 6] = [
        Fault::None,
        Fault::DropAfterApply,
        Fault::SlowAfterApply,
        Fault::UnavailableAfterApply,
        Fault::TooManyRequestsBeforeApply,
        Fault::InternalErrorBeforeApply,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::DropAfterApply => "drop-after-apply",
            Fault::SlowAfterApply => "slow-after-apply",
            Fault::UnavailableAfterApply => "503-after-apply",
            Fault::TooManyRequestsBeforeApply => "429-before-apply",
            Fault::InternalErrorBeforeApply => "500-before-apply",
        }
    }

    fn from_name(name: &str) -> Fault {
        Fault::ALL
            .into_iter()
            .find(|f| f.name() == name)
            .unwrap_or(Fault::None)
    }

    /// Whether the first attempt applies the side effect before failing.
    pub fn applies(self) -> bool {
        matches!(
            self,
            Fault::None
                | Fault::DropAfterApply
                | Fault::SlowAfterApply
                | Fault::UnavailableAfterApply
        )
    }
}

#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpStats {
    /// Requests that reached the handler.
    pub attempts: u32,
    /// Side effects applied (non-GET requests only).
    pub applied: u32,
    /// Last request body length seen, for body-replay checks.
    pub body_len: usize,
}

#[derive(Default)]
struct State {
    ops: Mutex<HashMap<String, OpStats>>,
}

pub struct FaultServer {
    addr: SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
    keys: Option<Keys>,
}

impl Drop for FaultServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A loopback address with nothing listening: connecting to it is refused. Its port is below
/// the kernel's ephemeral range ([`free_port`](crate::ports::free_port)): no port-0 listener of
/// another test takes it meanwhile, which would answer instead of refusing.
pub async fn refused_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], crate::ports::free_port()))
}

impl FaultServer {
    pub async fn start() -> FaultServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        Self::serve(listener, None)
    }

    /// Starts listening on `addr` (one that was refused until now).
    pub async fn start_at(addr: SocketAddr) -> FaultServer {
        let listener = TcpListener::bind(addr)
            .await
            .expect("bind the reserved port");
        Self::serve(listener, None)
    }

    /// A server that honours idempotency keys: the faults sit between the network and an
    /// `IdempotencyLayer` over the handler, so a response is lost or delayed after the
    /// handler ran and the layer stored it.
    #[cfg(feature = "server")]
    pub async fn start_with_keys(keys: Keys) -> FaultServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        Self::serve(listener, Some(keys))
    }

    fn serve(listener: TcpListener, keys: Option<Keys>) -> FaultServer {
        let addr = listener.local_addr().expect("addr");
        let state: Arc<State> = Arc::default();
        let shared = state.clone();
        let layer = keys.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = shared.clone();
                let layer = layer.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| handle(state.clone(), layer.clone(), req));
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        FaultServer {
            addr,
            state,
            task,
            keys,
        }
    }

    /// The idempotency layer of a server started with keys.
    pub fn keys(&self) -> Option<&Keys> {
        self.keys.as_ref()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn url(&self, op: &str) -> String {
        format!("http://{}/ops/{op}", self.addr)
    }

    pub fn stats(&self, op: &str) -> OpStats {
        self.state
            .ops
            .lock()
            .unwrap()
            .get(op)
            .copied()
            .unwrap_or_default()
    }

    pub fn applied(&self, op: &str) -> u32 {
        self.stats(op).applied
    }

    /// Operations whose side effect was applied more than once.
    pub fn applied_twice(&self) -> usize {
        let ops = self.state.ops.lock().unwrap();
        ops.values().filter(|s| s.applied > 1).count()
    }

    pub fn total_attempts(&self) -> u32 {
        self.state
            .ops
            .lock()
            .unwrap()
            .values()
            .map(|s| s.attempts)
            .sum()
    }
}

fn op_of(path: &str) -> String {
    path.strip_prefix("/ops/").unwrap_or(path).to_owned()
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut res = Response::new(Full::new(Bytes::from(body)).map_err(|e| match e {}).boxed());
    *res.status_mut() = status;
    res
}

/// The handler: applies a write (counted per op) and answers 200. `x-handler-delay-ms` makes
/// it take that long after applying.
async fn apply<B>(state: Arc<State>, req: Request<B>) -> Result<Response<Body>, io::Error>
where
    B: http_body::Body<Data = Bytes>,
{
    let op = op_of(req.uri().path());
    let delay = req
        .headers()
        .get("x-handler-delay-ms")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .map(Duration::from_millis);
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    {
        let mut ops = state.ops.lock().unwrap();
        let s = ops.entry(op.clone()).or_default();
        s.body_len = body.len();
        if parts.method != Method::GET {
            s.applied += 1;
        }
    }
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    let mut res = text(StatusCode::OK, format!("{} {}", parts.method, op));
    if let Some(id) = parts.headers.get("x-request-id") {
        res.headers_mut().insert("x-request-id", id.clone());
    }
    Ok(res)
}

async fn handle(
    state: Arc<State>,
    keys: Option<Keys>,
    req: Request<Incoming>,
) -> Result<Response<Body>, io::Error> {
    let op = op_of(req.uri().path());
    let fault = req
        .headers()
        .get("x-fault")
        .and_then(|v| v.to_str().ok())
        .map_or(Fault::None, Fault::from_name);
    let first = {
        let mut ops = state.ops.lock().unwrap();
        let s = ops.entry(op.clone()).or_default();
        s.attempts += 1;
        s.attempts == 1
    };
    let fault = if first { fault } else { Fault::None };
    match fault {
        Fault::TooManyRequestsBeforeApply => {
            let mut res = text(StatusCode::TOO_MANY_REQUESTS, String::new());
            res.headers_mut()
                .insert("retry-after", "0".parse().unwrap());
            return Ok(res);
        }
        Fault::InternalErrorBeforeApply => {
            return Ok(text(StatusCode::INTERNAL_SERVER_ERROR, String::new()))
        }
        _ => {}
    }
    let res = match keys {
        None => apply(state.clone(), req).await?,
        #[cfg(feature = "server")]
        Some(layer) => {
            use http_body_util::Either;
            use tower::ServiceExt;
            let handler = tower::service_fn(move |req: Request<Either<Full<Bytes>, Incoming>>| {
                apply(state.clone(), req)
            });
            let res = tower::Layer::layer(&layer, handler).oneshot(req).await?;
            res.map(|b| b.boxed())
        }
        #[cfg(not(feature = "server"))]
        Some(layer) => match layer {},
    };
    match fault {
        // A service error makes hyper close the connection without a response.
        Fault::DropAfterApply => Err(io::Error::other("drop the response")),
        Fault::SlowAfterApply => {
            tokio::time::sleep(SLOW).await;
            Ok(res)
        }
        Fault::UnavailableAfterApply => Ok(text(StatusCode::SERVICE_UNAVAILABLE, String::new())),
        _ => Ok(res),
    }
}
