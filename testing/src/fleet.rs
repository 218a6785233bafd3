//! A fleet on loopback: server instances, each with its own `IdempotencyLayer` over its own
//! `RedisStore` connection to one Redis, each on its own tokio runtime (so stopping one ends
//! every task it runs, as a crashed process would), behind a forwarder that sends an
//! operation's consecutive attempts to different instances. Side effects are counted per
//! operation across the fleet. Shared by `server/tests/stores/redis_fleet.rs` and `examples/fleet.rs`.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tower::{BoxError, ServiceExt};
use tower_idempotency_keys::{stores::RedisStore, IdempotencyLayer, StoreError};

type Body = BoxBody<Bytes, BoxError>;

/// What happens to an operation's first attempt (on whichever instance gets it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    None,
    /// Applied; the connection is then closed without a response.
    LostAfterApply,
    /// Applied; the handler then takes `SLOW_HANDLER`, past the client's timeout and the lease.
    SlowAfterApply,
    /// Applied; the response is replaced by a 503.
    UnavailableAfterApply,
    /// Not applied: 429 with `Retry-After: 0`.
    TooManyBeforeApply,
    /// Not applied: 500.
    InternalBeforeApply,
    /// Applied; then the instance is stopped while the handler is still running.
    InstanceStoppedAfterApply,
    /// Applied; then the handler waits until the test lets it answer (`Counts::let_answer`).
    HeldAfterApply,
}

impl Fault {
    pub const RECOVERABLE: [Fault; 6] = [
        Fault::None,
        Fault::LostAfterApply,
        Fault::SlowAfterApply,
        Fault::UnavailableAfterApply,
        Fault::TooManyBeforeApply,
        Fault::InternalBeforeApply,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::LostAfterApply => "lost-after-apply",
            Fault::SlowAfterApply => "slow-after-apply",
            Fault::UnavailableAfterApply => "503-after-apply",
            Fault::TooManyBeforeApply => "429-before-apply",
            Fault::InternalBeforeApply => "500-before-apply",
            Fault::InstanceStoppedAfterApply => "instance-stopped-after-apply",
            Fault::HeldAfterApply => "held-after-apply",
        }
    }

    fn from_name(name: &str) -> Fault {
        [Fault::InstanceStoppedAfterApply, Fault::HeldAfterApply]
            .into_iter()
            .chain(Fault::RECOVERABLE)
            .find(|f| f.name() == name)
            .unwrap_or(Fault::None)
    }
}

/// How long a slow handler takes after applying.
pub const SLOW_HANDLER: Duration = Duration::from_millis(2500);
/// The instances' lease: shorter than a slow handler, so only renewal keeps its claim.
pub const LEASE: Duration = Duration::from_millis(1500);

#[derive(Default)]
struct Shared {
    /// Attempts that reached any instance, and side effects applied, per operation.
    attempts: Mutex<HashMap<String, u32>>,
    applied: Mutex<HashMap<String, u32>>,
    /// Set when a handler asks for its instance to be stopped (or is held).
    stop_me: Notify,
    /// Lets a held handler answer.
    answer: Notify,
}

/// Counts kept across the whole fleet.
#[derive(Clone, Default)]
pub struct Counts(Arc<Shared>);

impl Counts {
    pub fn applied(&self, op: &str) -> u32 {
        self.0.applied.lock().unwrap().get(op).copied().unwrap_or(0)
    }

    pub fn applied_twice(&self) -> usize {
        self.0
            .applied
            .lock()
            .unwrap()
            .values()
            .filter(|&&n| n > 1)
            .count()
    }

    pub fn total_applied(&self) -> u32 {
        self.0.applied.lock().unwrap().values().sum()
    }

    /// Waits until a handler asks for its instance to be stopped (or is held).
    pub async fn stop_requested(&self) {
        self.0.stop_me.notified().await;
    }

    /// Lets a held handler (`Fault::HeldAfterApply`) answer.
    pub fn let_answer(&self) {
        self.0.answer.notify_one();
    }

    /// Lets every held handler answer at once.
    pub fn let_all_answer(&self) {
        self.0.answer.notify_waiters();
    }
}

/// One server instance on its own runtime. What it logs at `WARN` or above (a store error
/// the layer answered 503 for, with its cause) is printed when it is dropped during a panic: a
/// failing test's output says why its instances answered as they did.
pub struct Instance {
    pub addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
    log: Log,
}

/// What an instance's runtime threads log.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Ok(mut log) = self.0.lock() {
            log.extend_from_slice(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Instance {
    /// Starts an instance whose `IdempotencyLayer` uses a fresh `RedisStore` connection to
    /// `redis_url` with `prefix`.
    pub async fn start(redis_url: &str, prefix: &str, counts: Counts) -> Instance {
        let url = redis_url.to_owned();
        Instance::start_with(
            move || async move { RedisStore::connect(&url).await },
            prefix,
            LEASE,
            counts,
        )
        .await
    }

    /// Starts an instance whose `IdempotencyLayer` (with `lease`) uses the store `connect`
    /// makes, on the instance's runtime.
    pub async fn start_with<F, Fut>(
        connect: F,
        prefix: &str,
        lease: Duration,
        counts: Counts,
    ) -> Instance
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<RedisStore, StoreError>> + Send,
    {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let log = Log::default();
        let writer = log.clone();
        // Each thread of the runtime logs to `log` (its own default subscriber, for the thread's
        // life); the test's thread and other tests' instances are not affected.
        crate::spans::keep_interest_per_event();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .on_thread_start(move || {
                let writer = writer.clone();
                let subscriber = tracing_subscriber::fmt()
                    .with_max_level(tracing::Level::WARN)
                    .with_ansi(false)
                    .with_writer(move || writer.clone())
                    .finish();
                std::mem::forget(tracing::subscriber::set_default(subscriber));
            })
            .build()
            .expect("a runtime for the instance");
        let prefix = prefix.to_owned();
        // The store's connection lives on the instance's runtime, and dies with it.
        runtime
            .spawn(async move {
                let store = connect()
                    .await
                    .unwrap_or_else(|e| {
                        panic!(
                            "Redis for the instance: {e}: {:?}",
                            std::error::Error::source(&e)
                        )
                    })
                    .prefix(prefix);
                let layer = IdempotencyLayer::new(store).lease(lease);
                let listener = TcpListener::from_std(listener).expect("listener");
                tokio::spawn(accept(listener, layer, counts));
            })
            .await
            .expect("the instance started");
        Instance {
            addr,
            runtime: Some(runtime),
            log,
        }
    }

    /// Stops the instance as a crash would: every task it runs ends now, handlers included.
    pub fn stop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            let log = self.log.0.lock().map(|l| l.clone()).unwrap_or_default();
            if !log.is_empty() {
                eprintln!(
                    "the instance on {} logged:\n{}",
                    self.addr,
                    String::from_utf8_lossy(&log)
                );
            }
        }
    }
}

async fn accept(listener: TcpListener, layer: IdempotencyLayer<RedisStore>, counts: Counts) {
    while let Ok((stream, _)) = listener.accept().await {
        let (layer, counts) = (layer.clone(), counts.clone());
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(move |req| handle(layer.clone(), counts.clone(), req));
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
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

async fn handle(
    layer: IdempotencyLayer<RedisStore>,
    counts: Counts,
    req: Request<Incoming>,
) -> Result<Response<Body>, io::Error> {
    let op = req.uri().path().trim_start_matches('/').to_owned();
    let named = req
        .headers()
        .get("x-fault")
        .and_then(|v| v.to_str().ok())
        .map_or(Fault::None, Fault::from_name);
    let first = {
        let mut attempts = counts.0.attempts.lock().unwrap();
        let n = attempts.entry(op.clone()).or_default();
        *n += 1;
        *n == 1
    };
    let fault = if first { named } else { Fault::None };
    match fault {
        Fault::TooManyBeforeApply => {
            let mut res = text(StatusCode::TOO_MANY_REQUESTS, "");
            res.headers_mut()
                .insert("retry-after", "0".parse().unwrap());
            return Ok(res);
        }
        Fault::InternalBeforeApply => return Ok(text(StatusCode::INTERNAL_SERVER_ERROR, "")),
        _ => {}
    }
    let handler_counts = counts.clone();
    let handler = tower::service_fn(move |req: Request<Either<Full<Bytes>, Incoming>>| {
        let counts = handler_counts.clone();
        async move {
            let op = req.uri().path().trim_start_matches('/').to_owned();
            *counts.0.applied.lock().unwrap().entry(op).or_default() += 1;
            match fault {
                Fault::SlowAfterApply => tokio::time::sleep(SLOW_HANDLER).await,
                Fault::InstanceStoppedAfterApply => {
                    counts.0.stop_me.notify_one();
                    std::future::pending::<()>().await;
                }
                Fault::HeldAfterApply => {
                    counts.0.stop_me.notify_one();
                    counts.0.answer.notified().await;
                }
                _ => {}
            }
            // A body with a concrete error type: a boxed one trips rustc's higher-ranked
            // `Send` inference inside `tokio::spawn`.
            Ok::<_, io::Error>(http::Response::new(Full::new(Bytes::from_static(b"sent"))))
        }
    });
    let res = tower::Layer::layer(&layer, handler).oneshot(req).await?;
    match fault {
        // A service error makes hyper close the connection without a response.
        Fault::LostAfterApply => Err(io::Error::other("lose the response")),
        Fault::UnavailableAfterApply => Ok(text(StatusCode::SERVICE_UNAVAILABLE, "")),
        _ => Ok(res.map(|b| b.boxed())),
    }
}

/// A forwarder on loopback: attempt `n` of an operation goes to instance `n % len`; an
/// instance that refuses the connection is skipped (a load balancer's health check). An
/// upstream failure after connecting closes the client's connection without a response.
pub async fn forwarder(instances: Vec<SocketAddr>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("addr");
    let attempts: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let client: Client<HttpConnector, Incoming> =
        Client::builder(TokioExecutor::new()).build_http();
    let instances = Arc::new(instances);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (attempts, client, instances) =
                (attempts.clone(), client.clone(), instances.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let (attempts, client, instances) =
                        (attempts.clone(), client.clone(), instances.clone());
                    async move { forward(&attempts, &client, &instances, req).await }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

async fn forward(
    attempts: &Mutex<HashMap<String, usize>>,
    client: &Client<HttpConnector, Incoming>,
    instances: &[SocketAddr],
    req: Request<Incoming>,
) -> Result<Response<Incoming>, io::Error> {
    let n = {
        let mut attempts = attempts.lock().unwrap();
        let n = attempts.entry(req.uri().path().to_owned()).or_default();
        *n += 1;
        *n - 1
    };
    // Which live instance: probe the connection first, so a stopped one is skipped and the
    // request body is sent only once.
    let mut target = None;
    for i in 0..instances.len() {
        let candidate = instances[(n + i) % instances.len()];
        if tokio::net::TcpStream::connect(candidate).await.is_ok() {
            target = Some(candidate);
            break;
        }
    }
    let Some(target) = target else {
        return Err(io::Error::other("no instance is up"));
    };
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = format!("http://{target}{path}")
        .parse()
        .map_err(io::Error::other)?;
    match client.request(Request::from_parts(parts, body)).await {
        Ok(res) => Ok(res),
        // The upstream failed after the request may have reached it.
        Err(_) => Err(io::Error::other("upstream failed")),
    }
}
