//! The scenario of the renewal tests on busy runtimes: a keyed handler (busy in stretches,
//! waiting on I/O, or streaming a slow body) behind an `IdempotencyLayer`, served from a
//! runtime of a given flavour among busy tasks (yielding, or a pair that ping-pongs a token);
//! keyed requests (or one whose client goes away), repeats at 1.5 and 2.5 leases and after; and
//! the check that each key ran once. Over `MemoryStore` or `RedisStore` (a Redis case's keys are
//! deleted when it ends).

use crate::SERIAL;
use retry_safety_testing::redis::TestRedis;
use retry_safety_testing::runtime_server::{accept, listener, runtime, Flavour, Server};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::pg::fresh;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Frame;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{service_fn, Layer};
use tower_idempotency_keys::{
    stores::MemoryStore, stores::RedisStore, IdempotencyLayer, IdempotencyStore,
};

/// What a renewal test's handler does.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Work {
    /// Works `stretches` stretches of `stretch` without yielding, yielding between them.
    Busy { stretch: Duration, stretches: u32 },
    /// Waits on a timer (I/O) for `for_`: never polled meanwhile.
    Pending { for_: Duration },
    /// Answers at once with a body of `chunks` chunks, each after `stretch` of work without
    /// yielding and then a timer of `gap`.
    SlowBody {
        chunks: u32,
        stretch: Duration,
        gap: Duration,
    },
}

/// A response body that works (without yielding) and waits before each chunk.
struct SlowBody {
    left: u32,
    stretch: Duration,
    gap: Duration,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl SlowBody {
    fn full() -> SlowBody {
        SlowBody {
            left: 1,
            stretch: Duration::ZERO,
            gap: Duration::ZERO,
            sleep: None,
        }
    }
}

impl http_body::Body for SlowBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        use std::task::Poll;
        if let Some(s) = self.sleep.as_mut() {
            if s.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.sleep = None;
            self.left -= 1;
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"chunk")))));
        }
        if self.left == 0 {
            return Poll::Ready(None);
        }
        std::thread::sleep(self.stretch);
        if self.gap.is_zero() {
            self.left -= 1;
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"chunk")))));
        }
        let mut sleep = Box::pin(tokio::time::sleep(self.gap));
        if sleep.as_mut().poll(cx).is_pending() {
            self.sleep = Some(sleep);
            return Poll::Pending;
        }
        self.left -= 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"chunk")))))
    }
}

/// Does `work` (the handler's body) and returns the response body it answers with.
async fn do_work(work: Work) -> SlowBody {
    match work {
        Work::Busy { stretch, stretches } => {
            for _ in 0..stretches {
                std::thread::sleep(stretch);
                tokio::task::yield_now().await;
            }
            SlowBody::full()
        }
        Work::Pending { for_ } => {
            tokio::time::sleep(for_).await;
            SlowBody::full()
        }
        Work::SlowBody {
            chunks,
            stretch,
            gap,
        } => SlowBody {
            left: chunks,
            stretch,
            gap,
            sleep: None,
        },
    }
}

/// Two tasks that hand a token back and forth, each working `stretch` before it passes it on:
/// each wakes the other at once (no `yield_now`), so the run queue is never empty. They stop
/// once `stop` is set.
fn spawn_ping_pong(stretch: Duration, stop: &Arc<AtomicBool>) {
    let (ab_tx, mut ab_rx) = tokio::sync::mpsc::channel::<()>(1);
    let (ba_tx, mut ba_rx) = tokio::sync::mpsc::channel::<()>(1);
    let (sa, sb) = (stop.clone(), stop.clone());
    drop(tokio::spawn(async move {
        while !sa.load(Ordering::Relaxed) {
            std::thread::sleep(stretch);
            if ab_tx.send(()).await.is_err() || ba_rx.recv().await.is_none() {
                return;
            }
        }
    }));
    drop(tokio::spawn(async move {
        while !sb.load(Ordering::Relaxed) {
            if ab_rx.recv().await.is_none() {
                return;
            }
            std::thread::sleep(stretch);
            if ba_tx.send(()).await.is_err() {
                return;
            }
        }
    }));
}

/// The busy neighbours `busy` asks for on the current runtime: `usize::MAX` is a ping-pong
/// pair, any other count that many tasks working `busy.1` between yields, until `stop` is set.
fn spawn_busy(busy: (usize, Duration), stop: &Arc<AtomicBool>) {
    if busy.0 == usize::MAX {
        spawn_ping_pong(busy.1, stop);
        return;
    }
    for _ in 0..busy.0 {
        let (s, stretch) = (stop.clone(), busy.1);
        drop(tokio::spawn(async move {
            while !s.load(Ordering::Relaxed) {
                std::thread::sleep(stretch);
                tokio::task::yield_now().await;
            }
        }));
    }
}

/// Serves a handler doing `work` (counting its runs in the returned counter) behind an
/// `IdempotencyLayer` (lease `lease`) over the store `make_store` makes, from a runtime of
/// `flavour` on a thread of its own; `busy` other tasks there work `stretch` between yields
/// until the server stops.
fn serve_rt<St, F, Fut>(
    flavour: Flavour,
    lease: Duration,
    make_store: F,
    work: Work,
    busy: (usize, Duration),
) -> (SocketAddr, Arc<AtomicUsize>, Server)
where
    St: IdempotencyStore,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = St>,
{
    let applied = Arc::new(AtomicUsize::new(0));
    let counter = applied.clone();
    let (listener, addr) = listener();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let runtime = runtime(flavour);
        runtime.block_on(async move {
            let layer = IdempotencyLayer::new(make_store().await).lease(lease);
            let svc = layer.layer(service_fn(move |_req: Request<_>| {
                let counter = counter.clone();
                async move {
                    counter.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Infallible>(Response::new(do_work(work).await))
                }
            }));
            let stop = Arc::new(AtomicBool::new(false));
            spawn_busy(busy, &stop);
            let accept = accept(listener, svc);
            tokio::select! {
                _ = accept => {}
                _ = stop_rx => {}
            }
            stop.store(true, Ordering::Relaxed);
        });
    });
    (addr, applied, Server::new(stop_tx, thread))
}

async fn send(addr: SocketAddr, key: &str) -> (StatusCode, bool) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = Request::post(format!("http://{addr}/v1/send"))
        .header("idempotency-key", format!("\"{key}\""))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let res = client.request(req).await.expect("a response");
    let status = res.status();
    let stored = res.headers().contains_key("idempotent-replayed");
    let _ = res.into_body().collect().await;
    (status, stored)
}

/// A client that goes away 50 ms after sending: the call is detached onto the runtime.
async fn send_and_disconnect(addr: SocketAddr, key: &str) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = Request::post(format!("http://{addr}/v1/send"))
        .header("idempotency-key", format!("\"{key}\""))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let _ = tokio::time::timeout(Duration::from_millis(50), client.request(req)).await;
}

pub(crate) const LEASE: Duration = Duration::from_millis(400);

pub(crate) async fn memory() -> MemoryStore {
    MemoryStore::new()
}

/// The test's Redis (`REDIS_URL`, the local one, or a server of the test's own) and a store
/// under a prefix of the test's own; the [`TestRedis`] deletes the keys when dropped (the
/// test's end, passed or failed): a run leaves nothing behind.
pub(crate) fn redis_store(
    case: &str,
) -> (
    TestRedis,
    impl FnOnce() -> Pin<Box<dyn Future<Output = RedisStore> + Send>> + Send + 'static + use<>,
) {
    let redis = TestRedis::start(&format!("busy-runtime-{case}"));
    let (url, prefix) = (redis.url().to_owned(), redis.prefix().to_owned());
    (redis, move || {
        Box::pin(async move {
            RedisStore::connect(&url)
                .await
                .expect("the test's Redis")
                .prefix(prefix)
        })
    })
}

pub(crate) struct Seen {
    applied: usize,
    during: Vec<(StatusCode, bool)>,
    after: Vec<(StatusCode, bool)>,
}

impl Seen {
    pub(crate) fn assert_once(&self, keys: usize) {
        assert_eq!(
            self.applied, keys,
            "runs; during {:?} after {:?}",
            self.during, self.after
        );
        // 409 while it runs; the stored response if it ended meanwhile; never a fresh answer.
        assert!(
            self.during
                .iter()
                .all(|(s, r)| *s == StatusCode::CONFLICT || (*s == StatusCode::OK && *r)),
            "repeats while running: {:?}",
            self.during
        );
        assert!(
            self.during.iter().any(|(s, _)| *s == StatusCode::CONFLICT),
            "no repeat met a running handler: {:?}",
            self.during
        );
        assert!(
            self.after.iter().all(|(s, r)| *s == StatusCode::OK && *r),
            "repeats after: {:?}",
            self.after
        );
    }
}

/// `keys` keyed requests at once (or one that disconnects, `detach`), repeats of each at 1.5
/// and 2.5 leases, and after they end (or at 4 leases if detached).
pub(crate) fn scenario<St, F, Fut>(
    flavour: Flavour,
    make_store: F,
    work: Work,
    busy: (usize, Duration),
    keys: usize,
    detach: bool,
) -> Seen
where
    St: IdempotencyStore,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = St>,
{
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (addr, applied, server) = serve_rt(flavour, LEASE, make_store, work, busy);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let keys: Vec<String> = (0..keys).map(|i| fresh(&format!("r{i}"))).collect();
    let started = Instant::now();
    let (during, after) = rt.block_on(async {
        let mut firsts = Vec::new();
        for k in &keys {
            let k = k.clone();
            if detach {
                send_and_disconnect(addr, &k).await;
            } else {
                firsts.push(tokio::spawn(async move { send(addr, &k).await }));
            }
        }
        // All of a wave at once: on one busy thread each takes a round to be answered.
        let wave = |keys: &[String]| {
            let sends: Vec<_> = keys
                .iter()
                .map(|k| {
                    let k = k.clone();
                    tokio::spawn(async move { send(addr, &k).await })
                })
                .collect();
            async move {
                let mut out = Vec::new();
                for s in sends {
                    out.push(s.await.unwrap());
                }
                out
            }
        };
        let mut during = Vec::new();
        tokio::time::sleep(LEASE.mul_f64(1.5)).await;
        during.extend(wave(&keys).await);
        tokio::time::sleep((LEASE.mul_f64(2.5)).saturating_sub(started.elapsed())).await;
        during.extend(wave(&keys).await);
        for f in firsts {
            f.await.unwrap();
        }
        if detach {
            tokio::time::sleep((LEASE * 4).saturating_sub(started.elapsed())).await;
        }
        let mut after = Vec::new();
        for k in &keys {
            after.push(send(addr, k).await);
        }
        (during, after)
    });
    drop(server);
    Seen {
        applied: applied.load(Ordering::SeqCst),
        during,
        after,
    }
}

/// Work of ~3.2 leases in stretches of `stretch`.
pub(crate) fn busy_for(stretch: Duration, rounds_share: usize) -> Work {
    let stretches =
        (LEASE.as_secs_f64() * 3.2 / (stretch.as_secs_f64() * rounds_share as f64)).ceil() as u32;
    Work::Busy { stretch, stretches }
}
