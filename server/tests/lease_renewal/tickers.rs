//! The renewal ticker and the runtimes it lives on: a ticker stranded on another runtime, a
//! slow begin, a runtime shut down while claims run. Each test showed one defect and failed
//! on the commit under review (66b4554); each passes since its fix. From the review of issue
//! 19's fixes.

use crate::slow_begin::SlowBegin;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{Layer, ServiceExt};
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer, IdempotencyStore};

use crate::SERIAL;
use retry_safety_testing::runtime_server::{serve_on, Flavour, Server};

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
    let counter = applied.clone();
    let (addr, server) = serve_on(Flavour::MultiThread, move || async move {
        let layer = make_layer();
        layer.layer(tower::service_fn(move |_req: Request<_>| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                let end = tokio::time::Instant::now() + work;
                while tokio::time::Instant::now() < end {
                    tokio::time::sleep(step).await;
                }
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
            }
        }))
    });
    (addr, applied, server)
}

async fn send_keyed(addr: SocketAddr, key: &str) -> (StatusCode, bool) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = Request::post(format!("http://{addr}/v1/send"))
        .header("idempotency-key", format!("\"{key}\""))
        .body(Full::new(Bytes::from_static(b"{\"to\":\"a@example.com\"}")))
        .unwrap();
    let res = client.request(req).await.expect("a response");
    let status = res.status();
    let stored = res.headers().get("idempotent-replayed").is_some();
    let _ = res.into_body().collect().await;
    (status, stored)
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
///
/// Found by the review of issue 19's fixes.
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

/// "A slow reply from the store eats none of the margin" holds only once a ticker runs: the
/// first claim of a layer reads tick 0, but tick 0 (the epoch) is set only when the ticker
/// starts, after `begin` replied. With a reply 0.9 lease late the first renewal comes about
/// 1.15 leases after the claim, the lease has lapsed, and a repeat at 1.05 leases runs the
/// handler again (the handler itself yields every tenth of the lease).
///
/// Found by the review of issue 19's fixes.
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
///
/// Found by the review of issue 19's fixes.
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
///
/// Found by the review of issue 19's fixes.
#[test]
fn a_ticker_spawned_as_its_runtime_closes_blocks_every_later_ticker() {
    restart_case(true);
}

/// Control for the test above: the last claim on runtime A comes before it shuts down (its
/// ticker runs, and is dropped with the runtime): the layer on a new runtime keeps its claims.
///
/// Found by the review of issue 19's fixes.
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
