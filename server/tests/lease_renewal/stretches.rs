//! A claim's lease is renewed on a schedule of its own, whatever the handler does between two
//! `.await`s: real sockets on loopback, the stores' real clocks, both runtime flavours, and
//! handlers that apply their write and then work in stretches of 0.4, 0.6 and 0.9 × the lease
//! without yielding inside a stretch. Each run: the handler runs once, a repeat during it gets
//! 409, a repeat after it gets the stored response.
//!
//! The bound the server docs state ("Leases and fencing"): on a multi-thread runtime renewal
//! needs nothing of the handler while another worker is free; on a current-thread runtime the
//! thread must read its timers or come back to one of the layer's handlers at least once per
//! half lease with `MemoryStore` (every busy task's work counts), and once per quarter lease
//! with `RedisStore` (a renewal there takes a second turn of the runtime, for redis-rs's
//! connection task). `redis_one_thread_needs_a_yield_per_quarter_lease` shows that floor.

use crate::slow_begin::SlowBegin;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::Layer;
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer, IdempotencyStore};

const LEASE: Duration = Duration::from_millis(400);

use crate::SERIAL;
use retry_safety_testing::runtime_server::{serve_on, Flavour, Server};

/// A handler that applies its write, then works `stretches` times for `stretch` without
/// yielding, yielding once between stretches.
#[derive(Clone, Copy)]
struct Busy {
    stretch: Duration,
    stretches: u32,
}

impl Busy {
    fn of(fraction: f64) -> Busy {
        let stretch = LEASE.mul_f64(fraction);
        // At least 2.4 leases of work in all: the claim must be renewed twice at least.
        let stretches = (2.4 / fraction).ceil() as u32;
        Busy { stretch, stretches }
    }
}

/// Serves `layer` over `store` on loopback from a runtime of `flavour` on a thread of its
/// own; returns its address and the count of writes applied. The server stops when the
/// returned guard is dropped.
fn serve<St, F, Fut>(
    flavour: Flavour,
    make_store: F,
    busy: Busy,
) -> (SocketAddr, Arc<AtomicUsize>, Server)
where
    St: IdempotencyStore,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = St>,
{
    let applied = Arc::new(AtomicUsize::new(0));
    let counter = applied.clone();
    let (addr, server) = serve_on(flavour, move || async move {
        let layer = IdempotencyLayer::new(make_store().await).lease(LEASE);
        layer.layer(tower::service_fn(move |_req: Request<_>| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                for _ in 0..busy.stretches {
                    // Work that does not yield: the thread is taken for the stretch.
                    std::thread::sleep(busy.stretch);
                    tokio::task::yield_now().await;
                }
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
            }
        }))
    });
    (addr, applied, server)
}

struct Outcome {
    applied: usize,
    during: StatusCode,
    first: StatusCode,
    after: StatusCode,
    after_stored: bool,
}

/// The write, a repeat while its handler is busy (at 1.5 leases: past the first lease), and a
/// repeat after it answered.
async fn write_and_repeat(
    addr: SocketAddr,
    key: &str,
) -> (StatusCode, StatusCode, StatusCode, bool) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let send = |client: Client<_, Full<Bytes>>| {
        let req = Request::post(format!("http://{addr}/v1/send"))
            .header("idempotency-key", format!("\"{key}\""))
            .body(Full::new(Bytes::from_static(b"{\"to\":\"a@example.com\"}")))
            .expect("request");
        async move {
            let res = client.request(req).await.expect("a response");
            let status = res.status();
            let stored = res.headers().get("idempotent-replayed").is_some();
            let _ = res.into_body().collect().await;
            (status, stored)
        }
    };
    let first = tokio::spawn(send(client.clone()));
    tokio::time::sleep(LEASE.mul_f64(1.5)).await;
    let (during, _) = send(client.clone()).await;
    let (first, _) = first.await.expect("the first request");
    let (after, stored) = send(client).await;
    (first, during, after, stored)
}

fn run_case<St, F, Fut>(flavour: Flavour, fraction: f64, make_store: F, key: &str) -> Outcome
where
    St: IdempotencyStore,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = St>,
{
    let (addr, applied, server) = serve(flavour, make_store, Busy::of(fraction));
    let client_rt = tokio::runtime::Runtime::new().expect("client runtime");
    let (first, during, after, after_stored) = client_rt.block_on(write_and_repeat(addr, key));
    drop(server);
    Outcome {
        applied: applied.load(Ordering::SeqCst),
        during,
        first,
        after,
        after_stored,
    }
}

fn assert_once(o: &Outcome, case: &str) {
    assert_eq!(o.applied, 1, "{case}: the handler ran {} times", o.applied);
    assert_eq!(o.first, StatusCode::OK, "{case}: the first request");
    assert_eq!(
        o.during,
        StatusCode::CONFLICT,
        "{case}: a repeat during the handler"
    );
    assert_eq!(o.after, StatusCode::OK, "{case}: a repeat after it");
    assert!(
        o.after_stored,
        "{case}: the repeat after it is the stored response"
    );
}

fn memory_case(flavour: Flavour, fraction: f64) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let o = run_case(flavour, fraction, || async { MemoryStore::new() }, "mem");
    assert_once(
        &o,
        &format!("MemoryStore, {flavour:?}, stretches of {fraction} x lease"),
    );
}

#[test]
fn memory_one_thread_stretches_of_0_4_lease() {
    memory_case(Flavour::CurrentThread, 0.4);
}

#[test]
fn memory_one_thread_stretches_of_0_6_lease() {
    memory_case(Flavour::CurrentThread, 0.6);
}

#[test]
fn memory_one_thread_stretches_of_0_9_lease() {
    memory_case(Flavour::CurrentThread, 0.9);
}

#[test]
fn memory_multi_thread_stretches_of_0_4_lease() {
    memory_case(Flavour::MultiThread, 0.4);
}

#[test]
fn memory_multi_thread_stretches_of_0_6_lease() {
    memory_case(Flavour::MultiThread, 0.6);
}

#[test]
fn memory_multi_thread_stretches_of_0_9_lease() {
    memory_case(Flavour::MultiThread, 0.9);
}

/// On a multi-thread runtime a handler that never yields keeps its claim while another
/// worker is free: one stretch of 2.5 leases.
#[test]
fn memory_multi_thread_a_handler_that_never_yields() {
    memory_case(Flavour::MultiThread, 2.5);
}

/// `begin` answers half a lease after it took the claim, then the handler works in stretches
/// of 0.4 × the lease: its first yield comes at 0.9 lease after the claim. Renewal timed from
/// `begin`'s reply (as it was) comes only after the next stretch, past the lease.
#[test]
fn a_slow_reply_to_begin_eats_none_of_the_margin() {
    for flavour in [Flavour::CurrentThread, Flavour::MultiThread] {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let store = || async {
            SlowBegin {
                inner: MemoryStore::new(),
                reply_after: LEASE / 2,
            }
        };
        let o = run_case(flavour, 0.4, store, "slow-begin");
        assert_once(&o, &format!("slow begin, {flavour:?}"));
    }
}

mod redis_store {
    use super::*;
    use retry_safety_testing::redis::TestRedis;
    use tower_idempotency_keys::stores::RedisStore;

    pub(super) fn case(flavour: Flavour, fraction: f64) -> Outcome {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        // Deletes every key under the case's prefix when the case ends, also when it fails.
        let redis = TestRedis::start(&format!("lease-{flavour:?}-{fraction}"));
        let (url, p) = (redis.url().to_owned(), redis.prefix().to_owned());
        // The store connects on the server's own runtime (its connection task lives there).
        let make = move || async move {
            RedisStore::connect(&url)
                .await
                .expect("the test's Redis")
                .prefix(p)
        };
        run_case(flavour, fraction, make, "redis")
    }

    fn check(flavour: Flavour, fraction: f64) {
        let o = case(flavour, fraction);
        assert_once(
            &o,
            &format!("RedisStore, {flavour:?}, stretches of {fraction} x lease"),
        );
    }

    #[test]
    fn redis_multi_thread_stretches_of_0_4_lease() {
        check(Flavour::MultiThread, 0.4);
    }

    #[test]
    fn redis_multi_thread_stretches_of_0_6_lease() {
        check(Flavour::MultiThread, 0.6);
    }

    #[test]
    fn redis_multi_thread_stretches_of_0_9_lease() {
        check(Flavour::MultiThread, 0.9);
    }

    #[test]
    fn redis_multi_thread_a_handler_that_never_yields() {
        check(Flavour::MultiThread, 2.5);
    }

    #[test]
    fn redis_one_thread_needs_a_yield_per_quarter_lease() {
        check(Flavour::CurrentThread, 0.2);
    }
}

/// Three keyed writes at once on one runtime, each handler working in stretches of `fraction`
/// × the lease. On a current-thread runtime the thread yields after each stretch, but it comes
/// back to each handler, and to the ticker, only once per round of the three (3 × `fraction`).
/// Renewal from each handler's own poll alone came too late under load: CI saw a handler run
/// twice with stretches of 0.25 lease (a round of 0.75, a margin of 0.25). A handler's poll
/// renews its neighbours' claims too, so a claim is renewed at the end of whichever stretch
/// follows its quarter lease. Each key runs once; each repeat during its handler gets 409.
fn three_busy_handlers_at_once(flavour: Flavour, fraction: f64) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (addr, applied, server) =
        serve(flavour, || async { MemoryStore::new() }, Busy::of(fraction));
    let client_rt = tokio::runtime::Runtime::new().expect("client runtime");
    let outcomes = client_rt.block_on(async move {
        let runs = ["k1", "k2", "k3"].map(|key| tokio::spawn(write_and_repeat(addr, key)));
        let mut outcomes = Vec::new();
        for run in runs {
            outcomes.push(run.await.expect("a write and its repeats"));
        }
        outcomes
    });
    drop(server);
    let case = format!(
        "{flavour:?}, stretches of {fraction} x lease, (first, during, after, stored) = {outcomes:?}"
    );
    assert_eq!(applied.load(Ordering::SeqCst), 3, "three writes: {case}");
    for (first, during, after, stored) in outcomes {
        assert_eq!(first, StatusCode::OK, "{case}");
        assert_eq!(during, StatusCode::CONFLICT, "{case}");
        assert_eq!(after, StatusCode::OK, "{case}");
        assert!(stored, "{case}");
    }
}

#[test]
fn memory_one_thread_three_busy_handlers_at_once() {
    three_busy_handlers_at_once(Flavour::CurrentThread, 0.25);
}

/// A round of the three handlers (1.2 leases) is longer than the lease itself: only renewal
/// from whichever handler the thread is on keeps the other two claims. Before it, the handlers
/// ran 6 times for 3 writes: every repeat during a handler ran it again.
#[test]
fn memory_one_thread_three_handlers_whose_round_outlasts_the_lease() {
    three_busy_handlers_at_once(Flavour::CurrentThread, 0.4);
}

#[test]
fn memory_multi_thread_three_busy_handlers_at_once() {
    three_busy_handlers_at_once(Flavour::MultiThread, 0.25);
}
