//! A real hyper server on 127.0.0.1 whose responses can be cut mid-body, for the tests of
//! bodies read again or resumed. It counts requests, range requests, writes applied and body
//! bytes put on the wire (as the response bodies yield them).
//!
//! Every request gets the next entry of the cut plan (`Cut`), then whole answers; with the
//! plan empty, an `x-cut-first: N` header cuts the first response for its path after N bytes. `GET`s read
//! the server's representation (a strong ETag, range support and a changing ETag are
//! options); `POST`s apply a write (counted) and answer with the representation, behind the
//! crate's own `IdempotencyLayer` when the server honours keys.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Sleep;
use tower::ServiceExt;

use crate::keys::Keys;

/// What happens to one response's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// Sent whole.
    None,
    /// The connection is closed after this many bytes of the body.
    At(usize),
    /// After this many bytes the body stalls (for `STALL`, past any client timeout).
    StallAt(usize),
}

pub const STALL: Duration = Duration::from_secs(30);

#[derive(Clone, Debug)]
pub struct Options {
    /// The representation's bytes.
    pub body: Bytes,
    /// Send a strong ETag (`"v1"`; `"v2"`, `"v3"`… for later responses when `etag_changes`).
    pub etag: bool,
    pub etag_changes: bool,
    /// Send a weak ETag instead of a strong one.
    pub weak_etag: bool,
    /// Answer `Range: bytes=N-` with a 206 (when `If-Range` matches).
    pub ranges: bool,
    /// Answer a range with this many bytes more in front than asked for (a superset).
    pub superset: usize,
    /// How many bytes each body frame carries.
    pub frame: usize,
    /// A pause before each frame but the first.
    pub pace: Option<Duration>,
}

impl Options {
    pub fn new(body: Bytes) -> Self {
        Options {
            body,
            etag: true,
            etag_changes: false,
            weak_etag: false,
            ranges: true,
            superset: 0,
            frame: 16 * 1024,
            pace: None,
        }
    }
}

#[derive(Default)]
pub struct Counts {
    pub requests: AtomicU32,
    pub range_requests: AtomicU32,
    pub applied: AtomicU32,
    pub body_bytes: AtomicU64,
}

pub struct CutServer {
    addr: SocketAddr,
    pub counts: Arc<Counts>,
    task: JoinHandle<()>,
}

impl Drop for CutServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Shared {
    options: Options,
    plan: Mutex<VecDeque<Cut>>,
    /// Paths asked for so far: an `x-cut-first: N` header cuts a path's first response after
    /// N bytes of its body.
    seen: Mutex<std::collections::HashSet<String>>,
    counts: Arc<Counts>,
    keys: Option<Keys>,
}

impl CutServer {
    /// A server whose n-th response gets `plan[n]` (then whole answers).
    pub async fn start(options: Options, plan: Vec<Cut>) -> CutServer {
        Self::serve(options, plan, None).await
    }

    /// As `start`, with `POST`s behind the crate's `IdempotencyLayer`: the cut is between the
    /// network and the layer, after the handler ran and its response was stored.
    #[cfg(feature = "server")]
    pub async fn start_with_keys(options: Options, plan: Vec<Cut>) -> CutServer {
        let keys = Keys::new(tower_idempotency_keys::stores::MemoryStore::new());
        Self::serve(options, plan, Some(keys)).await
    }

    async fn serve(options: Options, plan: Vec<Cut>, keys: Option<Keys>) -> CutServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let counts = Arc::new(Counts::default());
        let shared = Arc::new(Shared {
            options,
            plan: Mutex::new(plan.into()),
            seen: Mutex::default(),
            counts: counts.clone(),
            keys,
        });
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let shared = shared.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let fut: Pin<Box<dyn Future<Output = _> + Send>> =
                            Box::pin(handle(shared.clone(), req));
                        fut
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        CutServer { addr, counts, task }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn requests(&self) -> u32 {
        self.counts.requests.load(Ordering::SeqCst)
    }

    pub fn range_requests(&self) -> u32 {
        self.counts.range_requests.load(Ordering::SeqCst)
    }

    pub fn applied(&self) -> u32 {
        self.counts.applied.load(Ordering::SeqCst)
    }

    pub fn body_bytes(&self) -> u64 {
        self.counts.body_bytes.load(Ordering::SeqCst)
    }
}

fn etag_of(options: &Options, n: u32) -> Option<String> {
    if !options.etag {
        return None;
    }
    let version = if options.etag_changes { n } else { 1 };
    Some(if options.weak_etag {
        format!("W/\"v{version}\"")
    } else {
        format!("\"v{version}\"")
    })
}

/// `bytes=N-` → N.
fn range_start(req: &Request<Incoming>) -> Option<usize> {
    let value = req.headers().get(header::RANGE)?.to_str().ok()?;
    let start = value.strip_prefix("bytes=")?.strip_suffix('-')?;
    start.parse().ok()
}

async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<CutBody>, io::Error> {
    let n = shared.counts.requests.fetch_add(1, Ordering::SeqCst) + 1;
    let first = shared
        .seen
        .lock()
        .unwrap()
        .insert(req.uri().path().to_owned());
    let cut_first = req
        .headers()
        .get("x-cut-first")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .filter(|_| first)
        .map_or(Cut::None, Cut::At);
    let cut = shared.plan.lock().unwrap().pop_front().unwrap_or(cut_first);
    let options = &shared.options;
    let etag = etag_of(options, n);
    if req.method() == Method::POST {
        let (parts, body) = post(&shared, req).await?;
        let body = CutBody::new(body, cut, options, shared.counts.clone());
        return Ok(Response::from_parts(parts, body));
    }
    let total = options.body.len();
    let mut res = Response::builder();
    if let Some(etag) = &etag {
        res = res.header(header::ETAG, etag.as_str());
    }
    let range = range_start(&req).filter(|_| options.ranges);
    let if_range_ok = match (req.headers().get(header::IF_RANGE), &etag) {
        (Some(asked), Some(etag)) => asked.as_bytes() == etag.as_bytes(),
        (Some(_), None) => false,
        (None, _) => true,
    };
    if range.is_some() {
        shared.counts.range_requests.fetch_add(1, Ordering::SeqCst);
    }
    let (status, bytes) = match range {
        Some(start) if if_range_ok && start < total => {
            let from = start.saturating_sub(options.superset);
            res = res.header(
                header::CONTENT_RANGE,
                format!("bytes {from}-{}/{total}", total - 1),
            );
            (StatusCode::PARTIAL_CONTENT, options.body.slice(from..))
        }
        _ => (StatusCode::OK, options.body.clone()),
    };
    if options.ranges {
        res = res.header(header::ACCEPT_RANGES, "bytes");
    }
    let body = CutBody::new(bytes, cut, options, shared.counts.clone());
    Ok(res.status(status).body(body).expect("response"))
}

/// Applies the write (behind the idempotency layer if the server has one) and answers with
/// the representation, collected so the cut can be put between the network and the layer.
async fn post(
    shared: &Shared,
    req: Request<Incoming>,
) -> Result<(http::response::Parts, Bytes), io::Error> {
    let counts = shared.counts.clone();
    let body = shared.options.body.clone();
    let handler = tower::service_fn(move |_req: Request<Either<Full<Bytes>, Incoming>>| {
        counts.applied.fetch_add(1, Ordering::SeqCst);
        let body = body.clone();
        async move { Ok::<_, io::Error>(Response::new(Full::new(body))) }
    });
    let res = match shared.keys.clone() {
        #[cfg(not(feature = "server"))]
        Some(layer) => match layer {},
        #[cfg(feature = "server")]
        Some(layer) => {
            let res = tower::Layer::layer(&layer, handler).oneshot(req).await?;
            res.map(|b| b.boxed())
        }
        None => {
            let res = handler.oneshot(req.map(Either::Right)).await?;
            res.map(|b| b.map_err(|e| match e {}).boxed())
        }
    };
    let (parts, body) = res.into_parts();
    let body = body
        .collect()
        .await
        .map_err(|_| io::Error::other("body"))?
        .to_bytes();
    Ok((parts, body))
}

/// A body with a known length that sends its bytes in frames, counts them, and is cut (or
/// stalls) where its `Cut` says. Before a cut it waits a moment so that hyper has written
/// what was sent.
pub struct CutBody {
    data: Bytes,
    sent: usize,
    cut: Cut,
    frame: usize,
    counts: Arc<Counts>,
    pause: Option<Pin<Box<Sleep>>>,
    pace: Option<Duration>,
    paced: Option<Pin<Box<Sleep>>>,
}

impl CutBody {
    fn new(data: Bytes, cut: Cut, options: &Options, counts: Arc<Counts>) -> Self {
        CutBody {
            data,
            sent: 0,
            cut,
            frame: options.frame.max(1),
            counts,
            pause: None,
            pace: options.pace,
            paced: None,
        }
    }

    fn stop_at(&self) -> Option<usize> {
        match self.cut {
            Cut::None => None,
            Cut::At(at) | Cut::StallAt(at) => Some(at.min(self.data.len())),
        }
    }
}

impl Body for CutBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let end = self.stop_at().unwrap_or(self.data.len());
        if self.sent < end && self.sent > 0 {
            if let Some(pace) = self.pace {
                let sleep = self
                    .paced
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(pace)));
                std::task::ready!(sleep.as_mut().poll(cx));
                self.paced = None;
            }
        }
        if self.sent < end {
            let upto = (self.sent + self.frame).min(end);
            let chunk = self.data.slice(self.sent..upto);
            self.sent = upto;
            self.counts
                .body_bytes
                .fetch_add(chunk.len() as u64, Ordering::SeqCst);
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if self.stop_at().is_none() {
            return Poll::Ready(None);
        }
        let pause = match self.cut {
            Cut::StallAt(_) => STALL,
            _ => Duration::from_millis(30),
        };
        let sleep = self
            .pause
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(pause)));
        std::task::ready!(sleep.as_mut().poll(cx));
        Poll::Ready(Some(Err(io::Error::other("cut"))))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.len() as u64)
    }
}
