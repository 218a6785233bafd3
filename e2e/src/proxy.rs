//! A proxy that retries streamed request bodies. A hyper server forwards each request, its
//! `Incoming` body boxed and streamed as it arrives, through this crate's layer and
//! hyper-util's client to an upstream on loopback. The layer records up to 64 KiB of each body
//! as it streams, so a retry can replay it; the upstream meets faults on each operation's first
//! attempt and counts what it applies.
//!
//! The proxy example (`cargo run --example proxy`) prints what it counts; the end-to-end tests
//! assert it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Either, Full, StreamBody};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{Layer, ServiceExt};
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};
use tower_retry_safety::{RetryPolicy, RetryReport, RetrySafety};

type Body = BoxBody<Bytes, hyper::Error>;

/// What happens to an operation's first attempt at the upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The connection is reset before the body is read: nothing applied.
    ResetBeforeBody,
    /// The body is read, then 503: nothing applied.
    Unavailable,
    /// The write is applied, then the connection closes without a response.
    LostAfterApply,
}

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::ResetBeforeBody => "reset-before-body",
            Fault::Unavailable => "unavailable",
            Fault::LostAfterApply => "lost-after-apply",
        }
    }
}

/// What the upstream saw of one operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// Requests that reached it.
    pub attempts: u32,
    /// Writes applied.
    pub applied: u32,
    /// Bodies applied that were not byte for byte what the client sent.
    pub corrupt: u32,
}

/// The upstream: applies writes (counted per path), behind an `IdempotencyLayer`, with the
/// faults between it and the network.
pub struct Upstream {
    pub addr: SocketAddr,
    seen: Arc<Mutex<HashMap<String, Seen>>>,
}

impl Upstream {
    pub fn seen(&self, path: &str) -> Seen {
        self.seen
            .lock()
            .unwrap()
            .get(path)
            .copied()
            .unwrap_or_default()
    }
}

/// The bytes the client streams: byte `i` is `i % 251`, so a byte lost or sent twice shows.
fn pattern(len: usize) -> impl Iterator<Item = u8> {
    (0..len).map(|i| (i % 251) as u8)
}

pub async fn start_upstream() -> io::Result<Upstream> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let seen: Arc<Mutex<HashMap<String, Seen>>> = Arc::default();
    let keys = IdempotencyLayer::new(MemoryStore::new());
    let state = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (seen, keys) = (state.clone(), keys.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req| upstream(seen.clone(), keys.clone(), req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(Upstream { addr, seen })
}

async fn upstream(
    seen: Arc<Mutex<HashMap<String, Seen>>>,
    keys: IdempotencyLayer<MemoryStore>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, io::Error> {
    let path = req.uri().path().to_owned();
    let first = {
        let mut seen = seen.lock().unwrap();
        let s = seen.entry(path.clone()).or_default();
        s.attempts += 1;
        s.attempts == 1
    };
    let fault = req.headers().get("x-fault").and_then(|v| v.to_str().ok());
    let fault = fault.filter(|_| first).map(str::to_owned);
    match fault.as_deref() {
        // Returning an error makes hyper close the connection, the body unread.
        Some("reset-before-body") => return Err(io::Error::other("reset")),
        Some("unavailable") => {
            let _ = req.into_body().collect().await;
            let mut res = Response::new(Full::default());
            *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            return Ok(res);
        }
        _ => {}
    }
    let applied = seen.clone();
    let handler = tower::service_fn(move |req: Request<Either<Full<Bytes>, Incoming>>| {
        let seen = applied.clone();
        async move {
            let path = req.uri().path().to_owned();
            let body = req.into_body().collect().await.map_err(io::Error::other)?;
            let body = body.to_bytes();
            let intact = body.iter().copied().eq(pattern(body.len()));
            let mut seen = seen.lock().unwrap();
            let s = seen.entry(path).or_default();
            s.applied += 1;
            s.corrupt += u32::from(!intact);
            Ok::<_, io::Error>(Response::new(Full::new(Bytes::from(format!(
                "applied {} bytes",
                body.len()
            )))))
        }
    });
    let res = keys.layer(handler).oneshot(req).await?;
    if fault.as_deref() == Some("lost-after-apply") {
        return Err(io::Error::other("the response is lost"));
    }
    let (parts, body) = res.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    Ok(Response::from_parts(parts, Full::new(body)))
}

/// The proxy's client: the layer over hyper-util's client, built for boxed bodies. A proxy
/// boxes the `Incoming` bodies it forwards, and the layer records `BoxBody` as it streams.
pub fn proxy_client(
    replay_buffer: usize,
) -> Result<RetrySafety<Client<HttpConnector, Body>>, tower_retry_safety::BuildError> {
    let policy = RetryPolicy::builder()
        .max_retries(3)
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        // The upstream honours keys on every route but one: a minted key makes a lost write
        // safe to retry into the stored response.
        .mint_idempotency_keys(true)
        .honor_idempotency_key_for_host("127.0.0.1")
        .route_honors_idempotency_key(Method::POST, "/v1/notify", false)
        .replay_buffer(replay_buffer)
        .build()?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    Ok(policy.layer(client))
}

pub async fn start_proxy(upstream: SocketAddr) -> io::Result<SocketAddr> {
    start_proxy_with(upstream, 64 * 1024).await
}

/// A proxy whose layer keeps `replay_buffer` bytes of each body (0: none).
pub async fn start_proxy_with(
    upstream: SocketAddr,
    replay_buffer: usize,
) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let client = proxy_client(replay_buffer).map_err(io::Error::other)?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let client = client.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| forward(client.clone(), upstream, req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(addr)
}

/// Forwards one request, its body streamed as it arrives, and says in headers what the layer
/// did: attempts, why it stopped, and why a body could not be sent again.
async fn forward(
    client: RetrySafety<Client<HttpConnector, Body>>,
    upstream: SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = match Uri::try_from(format!("http://{upstream}{path}")) {
        Ok(uri) => uri,
        Err(_) => return Ok(text(StatusCode::BAD_REQUEST, "bad path".into(), None)),
    };
    let req = Request::from_parts(parts, body.boxed());
    Ok(match client.oneshot(req).await {
        Ok(res) => {
            let report = RetryReport::of(&res).cloned();
            let mut res = res.map(BodyExt::boxed);
            annotate(&mut res, report.as_ref());
            res
        }
        Err(err) => text(StatusCode::BAD_GATEWAY, err.to_string(), err.report()),
    })
}

fn text(status: StatusCode, body: String, report: Option<&RetryReport>) -> Response<Body> {
    let mut res = Response::new(Full::new(Bytes::from(body)).map_err(|e| match e {}).boxed());
    *res.status_mut() = status;
    annotate(&mut res, report);
    res
}

fn annotate<B>(res: &mut Response<B>, report: Option<&RetryReport>) {
    let Some(report) = report else { return };
    let headers = res.headers_mut();
    headers.insert("x-proxy-attempts", HeaderValue::from(report.attempts()));
    headers.insert(
        "x-proxy-stop",
        HeaderValue::from_static(report.stop_reason().as_str()),
    );
    if let Some(why) = report.body_not_replayable() {
        if let Ok(value) = HeaderValue::try_from(why.to_string()) {
            headers.insert("x-proxy-not-replayable", value);
        }
    }
}

/// What the client got back for one streamed request.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub attempts: Option<u32>,
    pub stop: String,
    pub not_replayable: Option<String>,
    pub stored: bool,
}

/// Streams `len` bytes of the pattern in 4 KiB chunks to the proxy.
pub async fn send(
    proxy: SocketAddr,
    method: Method,
    path: &str,
    fault: Fault,
    len: usize,
) -> Result<Answer, Box<dyn std::error::Error + Send + Sync>> {
    let client = Client::builder(TokioExecutor::new()).build_http::<BoxBody<Bytes, Infallible>>();
    let bytes: Vec<u8> = pattern(len).collect();
    let chunks: Vec<Result<Frame<Bytes>, Infallible>> = bytes
        .chunks(4096)
        .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
        .collect();
    let body = StreamBody::new(futures_util::stream::iter(chunks)).boxed();
    let req = Request::builder()
        .method(method)
        .uri(format!("http://{proxy}{path}"))
        .header("x-fault", fault.name())
        .body(body)?;
    let res = client.request(req).await?;
    let header = |name: &str| {
        res.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    Ok(Answer {
        status: res.status(),
        attempts: header("x-proxy-attempts").and_then(|v| v.parse().ok()),
        stop: header("x-proxy-stop").unwrap_or_default(),
        not_replayable: header("x-proxy-not-replayable"),
        stored: header("idempotent-replayed").is_some(),
    })
}

/// The example's scenarios: method, path, fault, body length.
pub const SCENARIOS: [(Method, &str, Fault, usize); 5] = [
    (
        Method::PUT,
        "/v1/files/a",
        Fault::ResetBeforeBody,
        32 * 1024,
    ),
    (Method::PUT, "/v1/files/b", Fault::Unavailable, 32 * 1024),
    (
        Method::POST,
        "/v1/messages",
        Fault::LostAfterApply,
        32 * 1024,
    ),
    (Method::POST, "/v1/notify", Fault::LostAfterApply, 32 * 1024),
    (
        Method::PUT,
        "/v1/files/big",
        Fault::Unavailable,
        1024 * 1024,
    ),
];
