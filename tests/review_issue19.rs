//! Review of issue 19's fixes (lease renewal by a ticker, canonical hosts, lenient paths):
//! each test here showed one defect, through real sockets on loopback where a write is at
//! stake, and failed on the commit under review (66b4554); each passes since its fix. The names
//! say the defect they pin.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{Layer, ServiceExt};
use tower_retry_safety::server::{
    Begin, Claim, Entry, Fingerprint, IdempotencyLayer, IdempotencyStore, MemoryStore, StoreError,
    StoredResponse,
};
use tower_retry_safety::{Idempotency, RetryPolicy};

// ---------------------------------------------------------------------------------------------
// A counting allocator (this thread's allocations only), for the cost claims.

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations(f: impl FnOnce()) -> u64 {
    let before = ALLOCS.with(Cell::get);
    f();
    ALLOCS.with(Cell::get) - before
}

// ---------------------------------------------------------------------------------------------
// Client side: a server that applies every PUT, and loses the response to the first one.

type Ledger = Arc<Mutex<HashMap<String, u32>>>;

async fn serve_lossy(bind: IpAddr) -> (u16, Ledger) {
    serve_routed(bind, |p| p.to_owned()).await
}

/// As `serve_lossy`, counting writes by the path as `route` reads it.
async fn serve_routed(bind: IpAddr, route: fn(&str) -> String) -> (u16, Ledger) {
    let listener = TcpListener::bind(SocketAddr::new(bind, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let ledger = Ledger::default();
    let shared = ledger.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let ledger = shared.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let ledger = ledger.clone();
                    async move {
                        let applied = {
                            let mut ledger = ledger.lock().unwrap();
                            let n = ledger.entry(route(req.uri().path())).or_default();
                            *n += 1;
                            *n
                        };
                        if applied == 1 {
                            // Applied, then lost: hyper closes the connection unanswered.
                            return Err(io::Error::other("drop the response"));
                        }
                        Ok(Response::new(Full::new(Bytes::from_static(b"sent"))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (port, ledger)
}

fn policy(
    build: impl FnOnce(tower_retry_safety::RetryPolicyBuilder) -> tower_retry_safety::RetryPolicyBuilder,
) -> RetryPolicy {
    build(
        RetryPolicy::builder()
            .max_retries(2)
            .backoff(Duration::from_millis(1), Duration::from_millis(5))
            .no_budget(),
    )
    .build()
    .unwrap()
}

fn put(url: String) -> Request<Full<Bytes>> {
    Request::put(url)
        .body(Full::new(Bytes::from_static(b"{\"to\":\"a@example.com\"}")))
        .unwrap()
}

fn applied(ledger: &Ledger, path: &str) -> u32 {
    ledger.lock().unwrap().get(path).copied().unwrap_or(0)
}

/// An IPv4 literal with more than 12 leading zeros in a part (`0x0000000000007f.0.0.1`) is
/// 127.0.0.1 to the system resolver (glibc's inet_aton) and to the URL standard, but
/// `host::number` gives up past 12 digits, so the rule for 127.0.0.1 is missed and the PUT is
/// applied twice.
#[tokio::test]
async fn ipv4_with_many_leading_zeros_escapes_a_host_rule() {
    let (port, ledger) = serve_lossy(IpAddr::V4(Ipv4Addr::LOCALHOST)).await;
    let p = policy(|b| {
        b.route_for_host(
            "127.0.0.1",
            Method::PUT,
            "/v1/send/{id}",
            Idempotency::NonIdempotent,
        )
    });
    // The system resolver (hyper-util's default GaiResolver), as a production client has.
    let svc = p.layer(Client::builder(TokioExecutor::new()).build(HttpConnector::new()));
    // Control: the plain spelling is applied once.
    let _ = svc
        .clone()
        .oneshot(put(format!("http://127.0.0.1:{port}/v1/send/m0")))
        .await;
    assert_eq!(applied(&ledger, "/v1/send/m0"), 1, "the control");
    for (host, id) in [
        ("0x0000000000007f.0.0.1", "m1"),
        ("0000000000000177.0.0.1", "m2"),
        ("0x00000007f000001", "m3"),
    ] {
        let _ = svc
            .clone()
            .oneshot(put(format!("http://{host}:{port}/v1/send/{id}")))
            .await;
        let path = format!("/v1/send/{id}");
        assert_eq!(
            applied(&ledger, &path),
            1,
            "{host}: reached 127.0.0.1 and was applied {} times",
            applied(&ledger, &path)
        );
    }
}

/// An IPv6 literal with a zone id (`[::1%251]`: RFC 6874's `%25` then a numeric zone) is
/// accepted by `http::Uri`, and hyper-util's connector hands `::1%251` to the system resolver,
/// which connects to ::1 (a zone is ignored for a non-link-local address). `canonical` decodes
/// the `%25` but cannot parse `::1%1` as an address, so the rule for `[::1]` is missed and the
/// PUT is applied twice.
#[tokio::test]
async fn an_ipv6_zone_id_escapes_a_host_rule() {
    let (port, ledger) = serve_lossy("::1".parse().unwrap()).await;
    let p = policy(|b| {
        b.route_for_host(
            "[::1]",
            Method::PUT,
            "/v1/send/{id}",
            Idempotency::NonIdempotent,
        )
    });
    let svc = p.layer(Client::builder(TokioExecutor::new()).build(HttpConnector::new()));
    let _ = svc
        .clone()
        .oneshot(put(format!("http://[::1]:{port}/v1/send/m0")))
        .await;
    assert_eq!(applied(&ledger, "/v1/send/m0"), 1, "the control");
    let _ = svc
        .clone()
        .oneshot(put(format!("http://[::1%251]:{port}/v1/send/m1")))
        .await;
    let n = applied(&ledger, "/v1/send/m1");
    assert!(
        n > 0,
        "the zoned address did not reach ::1 (the case does not apply here)"
    );
    assert_eq!(n, 1, "[::1%251] reached ::1 and was applied {n} times");
}

/// A tower client over hyper's `client::conn::http1` sends origin-form requests (`/v1/send/m1`
/// plus a `Host` header), as proxies and connection-pool crates do. `Plan` reads the host only
/// from the URI, so a host-scoped `NonIdempotent` rule never matches, the PUT falls back to
/// "idempotent by method" and, after a lost response, is applied twice.
#[tokio::test]
async fn a_host_rule_is_missed_for_an_origin_form_request_with_a_host_header() {
    let (port, ledger) = serve_lossy(IpAddr::V4(Ipv4Addr::LOCALHOST)).await;
    let p = policy(|b| {
        b.route_for_host(
            "api.example.com",
            Method::PUT,
            "/v1/send/{id}",
            Idempotency::NonIdempotent,
        )
    });
    // One connection per request, as a minimal origin-form client.
    let connect = tower::service_fn(move |req: Request<Full<Bytes>>| async move {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(io::Error::other)?;
        tokio::spawn(conn);
        send.send_request(req).await.map_err(io::Error::other)
    });
    let svc = p.layer(connect);
    let req = Request::put("/v1/send/m1")
        .header(http::header::HOST, "api.example.com")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let _ = svc.oneshot(req).await;
    assert_eq!(
        applied(&ledger, "/v1/send/m1"),
        1,
        "the PUT to api.example.com (named by its Host header) was applied twice"
    );
}

/// `RetryPolicy::classify` "allocates nothing, but for a path over 256 bytes": with a rule
/// scoped to an IPv4 host, each request to that host allocates (`is_plain_name` compares
/// `ip.to_string()` with the host), though `canonical` returns it borrowed.
#[test]
fn classify_allocates_for_a_plain_ipv4_host() {
    let p = policy(|b| {
        b.route_for_host(
            "10.1.2.3",
            Method::PUT,
            "/v1/send/{id}",
            Idempotency::NonIdempotent,
        )
    });
    let req = Request::put("http://10.1.2.3:8080/v1/send/m1")
        .body(())
        .unwrap();
    let _ = p.classify(&req);
    let n = allocations(|| {
        std::hint::black_box(p.classify(&req));
    });
    assert_eq!(
        n, 0,
        "classify allocated {n} times for a canonical IPv4 host"
    );
}

/// The lenient spelling takes a scratch buffer of twice the path: a path of 129 to 256 bytes
/// with a `;` allocates, against the documented "allocates nothing, but for a path over 256
/// bytes".
#[test]
fn classify_allocates_for_a_lenient_path_under_256_bytes() {
    let p = policy(|b| b.route(Method::PUT, "/v1/send/{id}", Idempotency::NonIdempotent));
    let path = format!("/v1/other;v=1/{}", "a".repeat(150));
    assert!(path.len() < 256);
    let req = Request::put(format!("http://h{path}")).body(()).unwrap();
    let _ = p.classify(&req);
    let n = allocations(|| {
        std::hint::black_box(p.classify(&req));
    });
    assert_eq!(
        n,
        0,
        "classify allocated {n} times for a {}-byte path",
        path.len()
    );
}

// ---------------------------------------------------------------------------------------------
// Server side: lease renewal.

/// Rails adds `(.:format)` to every route: `PUT /v1/charges/ch_1/capture.json` runs the
/// `capture` action as `/v1/charges/ch_1/capture` does (Spring MVC before 5.3 does the same with
/// suffix pattern matching). No spelling cuts a format suffix, so a `NonIdempotent` rule for a
/// template that ends in a literal is missed and the PUT is applied twice.
#[tokio::test]
async fn a_format_suffix_escapes_a_path_rule() {
    /// Rails' router: an optional `.format` after the last segment.
    fn rails(path: &str) -> String {
        let (dir, last) = path.rsplit_once('/').unwrap_or(("", path));
        let last = last.split_once('.').map_or(last, |(name, _)| name);
        format!("{dir}/{last}")
    }
    let (port, ledger) = serve_routed(IpAddr::V4(Ipv4Addr::LOCALHOST), rails).await;
    let p = policy(|b| {
        b.route(
            Method::PUT,
            "/v1/charges/{id}/capture",
            Idempotency::NonIdempotent,
        )
    });
    let svc = p.layer(Client::builder(TokioExecutor::new()).build_http());
    // Control: as written, the rule holds.
    let _ = svc
        .clone()
        .oneshot(put(format!(
            "http://127.0.0.1:{port}/v1/charges/ch_0/capture"
        )))
        .await;
    assert_eq!(
        applied(&ledger, "/v1/charges/ch_0/capture"),
        1,
        "the control"
    );
    let _ = svc
        .clone()
        .oneshot(put(format!(
            "http://127.0.0.1:{port}/v1/charges/ch_1/capture.json"
        )))
        .await;
    assert_eq!(
        applied(&ledger, "/v1/charges/ch_1/capture"),
        1,
        "capture.json was routed to capture and applied twice"
    );
}

/// The renewal tests time real work against real clocks: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

struct Server {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Serves the layer `make_layer` builds (on the server's runtime: multi-thread, two workers)
/// over a handler that applies its write, then works for `work` in steps of `step`, each an
/// `.await` that waits (the handler yields all the time). Returns the address, the count of
/// writes applied, and the server (stopped when dropped).
fn serve_layer<St, F>(
    make_layer: F,
    work: Duration,
    step: Duration,
) -> (SocketAddr, Arc<AtomicUsize>, Server)
where
    St: IdempotencyStore,
    F: FnOnce() -> IdempotencyLayer<St> + Send + 'static,
{
    let applied = Arc::new(AtomicUsize::new(0));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let counter = applied.clone();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let layer = make_layer();
            let svc = layer.layer(tower::service_fn(move |_req: Request<_>| {
                let counter = counter.clone();
                async move {
                    counter.fetch_add(1, Ordering::SeqCst);
                    let end = tokio::time::Instant::now() + work;
                    while tokio::time::Instant::now() < end {
                        tokio::time::sleep(step).await;
                    }
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
                }
            }));
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let accept = async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        return;
                    };
                    let svc = svc.clone();
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                            tower::ServiceExt::oneshot(svc.clone(), req)
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
            };
            tokio::select! {
                _ = accept => {}
                _ = stop_rx => {}
            }
        });
    });
    (
        addr,
        applied,
        Server {
            stop: Some(stop_tx),
            thread: Some(thread),
        },
    )
}

async fn send_keyed(addr: SocketAddr, key: &str) -> (StatusCode, bool) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = Request::post(format!("http://{addr}/v1/send"))
        .header("idempotency-key", format!("\"{key}\""))
        .body(Full::new(Bytes::from_static(b"{\"to\":\"a@example.com\"}")))
        .unwrap();
    let res = client.request(req).await.expect("a response");
    let status = res.status();
    let replayed = res.headers().get("idempotent-replayed").is_some();
    let _ = res.into_body().collect().await;
    (status, replayed)
}

/// The write, and a repeat `repeat_after` later (past the first lease, while the handler runs):
/// the repeat's status, and the first's.
fn write_and_repeat(
    addr: SocketAddr,
    key: &str,
    repeat_after: Duration,
) -> (StatusCode, StatusCode) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let first = tokio::spawn({
            let key = key.to_owned();
            async move { send_keyed(addr, &key).await }
        });
        tokio::time::sleep(repeat_after).await;
        let (during, _) = send_keyed(addr, key).await;
        let (first, _) = first.await.unwrap();
        (during, first)
    })
}

/// One layer shared by two runtimes (thread-per-core servers run a current-thread runtime per
/// thread and clone one layer into each). The first claim spawns the layer's one ticker on
/// runtime A, which is then not driven (or busy): the `ticking` flag stays set, no ticker is
/// ever started on runtime B, and a handler on B that yields every tenth of the lease loses its
/// claim: the repeat runs the write a second time instead of getting 409.
#[test]
fn a_ticker_stranded_on_another_runtime_renews_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lease = Duration::from_millis(300);
    let layer = IdempotencyLayer::new(MemoryStore::new()).lease(lease);
    // Runtime A: one keyed request, then the runtime is kept but not driven.
    let runtime_a = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let warm = layer.clone();
    runtime_a.block_on(async move {
        let svc = warm.layer(tower::service_fn(|_req: Request<_>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }));
        let req = Request::post("/v1/warm")
            .header("idempotency-key", "\"warm\"")
            .body(Full::new(Bytes::from_static(b"x")))
            .unwrap();
        let res = svc.oneshot(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    });
    // Runtime B serves real requests with the same layer.
    let (addr, applied, server) = serve_layer(move || layer, lease * 4, lease / 10);
    let (during, first) = write_and_repeat(addr, "stranded", lease.mul_f64(1.6));
    drop(server);
    drop(runtime_a);
    assert_eq!(first, StatusCode::OK);
    assert_eq!(
        applied.load(Ordering::SeqCst),
        1,
        "the handler ran twice (the repeat got {during})"
    );
    assert_eq!(during, StatusCode::CONFLICT);
}

/// A store that answers `begin` late, after taking the claim (a slow network, a store that
/// just reconnected).
struct SlowBegin<St> {
    inner: St,
    reply_after: Duration,
}

impl<St: IdempotencyStore> IdempotencyStore for SlowBegin<St> {
    fn begin(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send {
        let claimed = self.inner.begin(key, fingerprint, lease);
        let wait = self.reply_after;
        async move {
            let out = claimed.await;
            tokio::time::sleep(wait).await;
            out
        }
    }
    fn renew(
        &self,
        key: &str,
        claim: Claim,
        lease: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.renew(key, claim, lease)
    }
    fn complete(
        &self,
        key: &str,
        claim: Claim,
        fingerprint: Fingerprint,
        response: StoredResponse,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.complete(key, claim, fingerprint, response, ttl)
    }
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<Entry>, StoreError>> + Send {
        self.inner.get(key)
    }
    fn release(
        &self,
        key: &str,
        claim: Claim,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.release(key, claim)
    }
}

/// "A slow reply from the store eats none of the margin" holds only once a ticker runs: the
/// first claim of a layer reads tick 0, but tick 0 (the epoch) is set only when the ticker
/// starts, after `begin` replied. With a reply 0.9 lease late the first renewal comes about
/// 1.15 leases after the claim, the lease has lapsed, and a repeat at 1.05 leases runs the
/// handler again (the handler itself yields every tenth of the lease).
#[test]
fn the_first_claim_of_a_layer_loses_its_lease_to_a_slow_begin() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lease = Duration::from_millis(1000);
    let make = move || {
        IdempotencyLayer::new(SlowBegin {
            inner: MemoryStore::new(),
            reply_after: lease.mul_f64(0.9),
        })
        .lease(lease)
    };
    let (addr, applied, server) = serve_layer(make, lease * 3, lease / 10);
    let (during, first) = write_and_repeat(addr, "cold", lease.mul_f64(1.05));
    drop(server);
    assert_eq!(first, StatusCode::OK);
    assert_eq!(
        applied.load(Ordering::SeqCst),
        1,
        "the handler ran twice (the repeat got {during})"
    );
    assert_eq!(during, StatusCode::CONFLICT);
}

/// Control for the test above: the same slow store and timings, with a ticker already running
/// (an earlier claim on another key): the handler runs once and the repeat gets 409.
#[test]
fn control_a_slow_begin_with_a_running_ticker_keeps_its_lease() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lease = Duration::from_millis(1000);
    let make = move || {
        IdempotencyLayer::new(SlowBegin {
            inner: MemoryStore::new(),
            reply_after: lease.mul_f64(0.9),
        })
        .lease(lease)
    };
    let (addr, applied, server) = serve_layer(make, lease * 3, lease / 10);
    // Warm: a first claim starts the ticker; the write under test comes while it runs.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let warm = rt.spawn(async move { send_keyed(addr, "warm").await });
    std::thread::sleep(lease.mul_f64(1.2));
    let (during, first) = write_and_repeat(addr, "warmed", lease.mul_f64(1.05));
    let _ = rt.block_on(warm);
    drop(server);
    assert_eq!(first, StatusCode::OK);
    assert_eq!(
        applied.load(Ordering::SeqCst),
        2,
        "the warm-up and the write, once each"
    );
    assert_eq!(during, StatusCode::CONFLICT);
}

/// A claim made while its runtime shuts down (a server's graceful stop with a request in
/// flight) spawns the layer's ticker on a runtime that already closed its task list: tokio drops
/// the ticker unpolled, so its guard (`Ticking`, made inside the task) never exists and the
/// `ticking` flag stays set for good. The same layer on a new runtime then renews nothing: a
/// handler that yields every tenth of the lease loses its claim and runs twice.
#[test]
fn a_ticker_spawned_as_its_runtime_closes_blocks_every_later_ticker() {
    restart_case(true);
}

/// Control for the test above: the last claim on runtime A comes before it shuts down (its
/// ticker runs, and is dropped with the runtime): the layer on a new runtime keeps its claims.
#[test]
fn control_a_runtime_shut_down_after_its_claims_leaves_the_layer_usable() {
    restart_case(false);
}

fn restart_case(claim_while_closing: bool) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lease = Duration::from_millis(300);
    let layer = IdempotencyLayer::new(MemoryStore::new()).lease(lease);
    let runtime_a = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let closing = layer.clone();
    runtime_a.spawn(async move {
        // The worker is busy when the runtime is told to stop, then the keyed call goes on.
        if claim_while_closing {
            std::thread::sleep(Duration::from_millis(300));
        }
        let svc = closing.layer(tower::service_fn(|_req: Request<_>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }));
        let req = Request::post("/v1/last")
            .header("idempotency-key", "\"last\"")
            .body(Full::new(Bytes::from_static(b"x")))
            .unwrap();
        let _ = svc.oneshot(req).await;
    });
    std::thread::sleep(Duration::from_millis(100));
    runtime_a.shutdown_background();
    std::thread::sleep(Duration::from_millis(400));
    // The server restarts its runtime with the same layer.
    let (addr, applied, server) = serve_layer(move || layer, lease * 4, lease / 10);
    let (during, first) = write_and_repeat(addr, "after-restart", lease.mul_f64(1.6));
    drop(server);
    assert_eq!(first, StatusCode::OK);
    assert_eq!(
        applied.load(Ordering::SeqCst),
        1,
        "the handler ran twice (the repeat got {during})"
    );
    assert_eq!(during, StatusCode::CONFLICT);
}
