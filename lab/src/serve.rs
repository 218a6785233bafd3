//! `serve`: an upstream for a quick try, answering any route with a small JSON body behind
//! tower-idempotency-keys' [`IdempotencyLayer`].

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use tower::{Layer, ServiceExt};

use crate::error::LabError;
use crate::headers::{FAIL_HEADER, HOLD_HEADER, RUN_HEADER};
use crate::listen::{self, Listening};
use tower_idempotency_keys::stores::MemoryStore;
use tower_idempotency_keys::{IdempotencyLayer, IdempotencyStore};

const MAX_HOLD: Duration = Duration::from_secs(60);

/// A running upstream: every route answers 200 with `{"run":N,"method":…,"path":…}`, the
/// run's number in [`RUN_HEADER`] and, for a write, a `location` naming the run; keyed
/// requests go through an [`IdempotencyLayer`] (409 in flight, the stored response on a
/// repeat, 422 for another payload, 400 for a malformed key). Stops when dropped.
#[derive(Debug)]
pub struct Upstream {
    addr: SocketAddr,
    runs: Arc<AtomicU64>,
    _listening: Listening,
}

impl Upstream {
    /// Listens on `addr` with an in-memory store.
    pub async fn start(addr: SocketAddr) -> Result<Upstream, LabError> {
        Self::start_with(addr, IdempotencyLayer::new(MemoryStore::new())).await
    }

    /// Listens on `addr` with the layer given (another store, other settings).
    pub async fn start_with<St>(
        addr: SocketAddr,
        layer: IdempotencyLayer<St>,
    ) -> Result<Upstream, LabError>
    where
        St: IdempotencyStore,
    {
        let listener = listen::bind("--listen", addr).await?;
        let addr = listener
            .local_addr()
            .map_err(|err| LabError::new("--listen", err.to_string()))?;
        let runs = Arc::new(AtomicU64::new(0));
        let counter = runs.clone();
        let svc = layer.layer(tower::service_fn(move |req| handle(counter.clone(), req)));
        let listening = listen::serve(listener, move |req: Request<Incoming>| {
            svc.clone().oneshot(req)
        });
        Ok(Upstream {
            addr,
            runs,
            _listening: listening,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many times the handler ran (a stored response runs nothing).
    pub fn handler_runs(&self) -> u64 {
        self.runs.load(Ordering::SeqCst)
    }
}

async fn handle(
    runs: Arc<AtomicU64>,
    req: Request<Either<Full<Bytes>, Incoming>>,
) -> Result<Response<Full<Bytes>>, io::Error> {
    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
    let (parts, body) = req.into_parts();
    // The body is read as a handler would; its content does not matter here.
    let _ = body.collect().await;
    let hold = parts
        .headers
        .get(HOLD_HEADER)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
        .map(|ms| Duration::from_millis(ms).min(MAX_HOLD));
    if let Some(hold) = hold {
        tokio::time::sleep(hold).await;
    }
    if parts.headers.contains_key(FAIL_HEADER) {
        return Err(io::Error::other("the lab's handler failed, as asked"));
    }
    let path = parts.uri.path();
    let body = serde_json::json!({ "run": run, "method": parts.method.as_str(), "path": path });
    let mut res = Response::new(Full::new(Bytes::from(body.to_string())));
    *res.status_mut() = StatusCode::OK;
    let headers = res.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(RUN_HEADER, HeaderValue::from(run));
    if parts.method != Method::GET && parts.method != Method::HEAD {
        if let Ok(location) = HeaderValue::from_str(&format!("/lab/runs/{run}")) {
            headers.insert(http::header::LOCATION, location);
        }
    }
    Ok(res)
}
