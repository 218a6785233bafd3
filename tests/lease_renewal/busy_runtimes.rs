//! Lease renewal from the handler's own task on busy runtimes: busy handlers on one thread,
//! handlers waiting on I/O, slowly streamed bodies, detached calls, and the two ping-pong
//! cases tokio's current-thread scheduler cannot keep (`#[ignore = "known limit, …"]`, run
//! them with `--ignored`). From the review, round 2, of lease renewal (08a8b2f).

use crate::support::runtime_server::{accept, listener, runtime, Flavour, Server};
use crate::SERIAL;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
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
use tower_idempotency_keys::{IdempotencyLayer, IdempotencyStore, MemoryStore, RedisStore};

// ---------------------------------------------------------------------------------------------
// Lease renewal
// ---------------------------------------------------------------------------------------------

/// What a renewal test's handler does.
#[derive(Clone, Copy, Debug)]
enum Work {
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
                    let body = match work {
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
                    };
                    Ok::<_, Infallible>(Response::new(body))
                }
            }));
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            if busy.0 == usize::MAX {
                // Two tasks that hand a token back and forth, each working `busy.1` before it
                // passes it on: each wakes the other at once (no `yield_now`), so the run queue
                // is never empty.
                let (ab_tx, mut ab_rx) = tokio::sync::mpsc::channel::<()>(1);
                let (ba_tx, mut ba_rx) = tokio::sync::mpsc::channel::<()>(1);
                let (sa, sb, stretch) = (stop.clone(), stop.clone(), busy.1);
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
            for _ in 0..if busy.0 == usize::MAX { 0 } else { busy.0 } {
                let (s, stretch) = (stop.clone(), busy.1);
                drop(tokio::spawn(async move {
                    while !s.load(Ordering::Relaxed) {
                        std::thread::sleep(stretch);
                        tokio::task::yield_now().await;
                    }
                }));
            }
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
    let replayed = res.headers().contains_key("idempotent-replayed");
    let _ = res.into_body().collect().await;
    (status, replayed)
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

const LEASE: Duration = Duration::from_millis(400);

async fn memory() -> MemoryStore {
    MemoryStore::new()
}

/// Deletes every key under its prefix when dropped (the test's end, passed or failed): a run
/// leaves nothing behind.
struct Clean(String);

impl Drop for Clean {
    fn drop(&mut self) {
        let url =
            std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
        let Ok(mut conn) = redis::Client::open(url).and_then(|c| c.get_connection()) else {
            return;
        };
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", self.0))
            .query(&mut conn)
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query(&mut conn);
        }
    }
}

fn redis_store(
    case: &str,
) -> (
    Clean,
    impl FnOnce() -> Pin<Box<dyn Future<Output = RedisStore> + Send>> + Send + 'static + use<>,
) {
    let prefix = format!("{}:", fresh(&format!("trs-r2-{case}")));
    let clean = Clean(prefix.clone());
    (clean, move || {
        Box::pin(async move {
            let url =
                std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
            RedisStore::connect(&url)
                .await
                .expect("Redis on 127.0.0.1:6379")
                .prefix(prefix)
        })
    })
}

struct Seen {
    applied: usize,
    during: Vec<(StatusCode, bool)>,
    after: Vec<(StatusCode, bool)>,
}

impl Seen {
    fn assert_once(&self, keys: usize) {
        assert_eq!(
            self.applied, keys,
            "runs; during {:?} after {:?}",
            self.during, self.after
        );
        // 409 while it runs; a replay if it ended meanwhile; never a fresh answer.
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
fn scenario<St, F, Fut>(
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
fn busy_for(stretch: Duration, rounds_share: usize) -> Work {
    let stretches =
        (LEASE.as_secs_f64() * 3.2 / (stretch.as_secs_f64() * rounds_share as f64)).ceil() as u32;
    Work::Busy { stretch, stretches }
}

// HELD. Twelve keyed handlers on one thread, each working 15 ms (0.0375 lease) between yields:
// the thread comes back to each every 0.45 lease (within the documented half lease).
/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
fn twelve_busy_handlers_on_one_thread_memory() {
    let stretch = Duration::from_millis(15);
    scenario(
        Flavour::CurrentThread,
        memory,
        busy_for(stretch, 12),
        (0, Duration::ZERO),
        12,
        false,
    )
    .assert_once(12);
}

// Redis on one thread: the documented floor is a quarter lease per round; 12 × 7 ms = 0.21.
/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
fn twelve_busy_handlers_on_one_thread_redis() {
    let stretch = Duration::from_millis(7);
    let (_clean, store) = redis_store("many");
    scenario(
        Flavour::CurrentThread,
        store,
        busy_for(stretch, 12),
        (0, Duration::ZERO),
        12,
        false,
    )
    .assert_once(12);
}

// A handler pending on I/O is never polled: only the ticker renews it. Two other tasks work
// 0.2 lease between yields (a round of 0.4 lease, within the documented half lease).
/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
fn a_handler_waiting_on_io_among_busy_tasks_one_thread_memory() {
    scenario(
        Flavour::CurrentThread,
        memory,
        Work::Pending { for_: LEASE * 3 },
        (2, LEASE.mul_f64(0.2)),
        1,
        false,
    )
    .assert_once(1);
}

// Same for Redis, two tasks of 0.1 lease (a round of 0.2 lease: within a quarter lease).
/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
fn a_handler_waiting_on_io_among_busy_tasks_one_thread_redis() {
    let (_clean, store) = redis_store("pending");
    scenario(
        Flavour::CurrentThread,
        store,
        Work::Pending { for_: LEASE * 3 },
        (2, LEASE.mul_f64(0.1)),
        1,
        false,
    )
    .assert_once(1);
}

// The response body is buffered inside `Renewal::during`: a body that streams over 3 leases
// (0.3 lease of work, then 0.2 lease of waiting, per chunk) keeps its claim.
/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
fn a_slowly_streamed_body_keeps_its_claim_one_thread_memory() {
    scenario(
        Flavour::CurrentThread,
        memory,
        Work::SlowBody {
            chunks: 6,
            stretch: LEASE.mul_f64(0.3),
            gap: LEASE.mul_f64(0.2),
        },
        (0, Duration::ZERO),
        1,
        false,
    )
    .assert_once(1);
}

/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
fn a_slowly_streamed_body_keeps_its_claim_multi_thread_redis() {
    let (_clean, store) = redis_store("body");
    scenario(
        Flavour::MultiThread,
        store,
        Work::SlowBody {
            chunks: 6,
            stretch: LEASE.mul_f64(0.45),
            gap: LEASE.mul_f64(0.05),
        },
        (0, Duration::ZERO),
        1,
        false,
    )
    .assert_once(1);
}

// A detached call (the client went away at 50 ms) keeps renewing on a current-thread runtime.
/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
fn a_detached_call_keeps_its_claim_one_thread_memory() {
    scenario(
        Flavour::CurrentThread,
        memory,
        busy_for(LEASE.mul_f64(0.3), 1),
        (0, Duration::ZERO),
        1,
        true,
    )
    .assert_once(1);
}

/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
fn a_detached_call_keeps_its_claim_one_thread_redis() {
    let (_clean, store) = redis_store("detached");
    scenario(
        Flavour::CurrentThread,
        store,
        busy_for(LEASE.mul_f64(0.2), 1),
        (0, Duration::ZERO),
        1,
        true,
    )
    .assert_once(1);
}

// Redis on a multi-thread runtime: a handler working 0.45 lease between yields (so each of its
// polls renews from its own task, whose Redis reply must wait for a spawned task) while one
// other task is busy too, 0.45 lease between yields: a free worker only at times.
/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
fn redis_multi_thread_handler_renewing_itself_among_a_busy_task() {
    let (_clean, store) = redis_store("mt");
    scenario(
        Flavour::MultiThread,
        store,
        busy_for(LEASE.mul_f64(0.45), 1),
        (1, LEASE.mul_f64(0.45)),
        1,
        false,
    )
    .assert_once(1);
}

// DEFECT (renewal, current-thread). A keyed handler waiting on I/O (here a timer; a socket is
// the same) while two unrelated tasks hand a token back and forth over channels, each working
// 8 ms (0.02 lease) per turn. Every stretch is far under the documented half lease, and so is a
// round of all busy tasks (16 ms: each has had its turn). But the docs' model — "it reads its
// timers only when every task ready to run has had its turn" — is not tokio's: tasks that wake
// each other directly (a channel, a Notify; not `yield_now`, which defers its wake until after
// the driver) never empty the run queue, and the current-thread scheduler then polls its
// drivers only once every `event_interval` = 61 task polls: 61 × 8 ms ≈ 490 ms > the 400 ms
// lease. The ticker's timer fires that late, the pending handler is not polled either (its
// wake comes from the same driver), so nothing renews the claim for over a lease; the repeat,
// accepted at the next driver poll, finds the key free and runs the handler a second time.
// Seen (3 of 3 runs): runs 2; the repeat at 1.5 leases got a fresh 200, not 409.
//
// Proposed fix: the ticker must not depend on the runtime's timer driver on a current-thread
// runtime: run it on a thread of the layer's own (`std::thread` + `std::thread::sleep`, or a
// one-thread runtime of its own) that sends renewals itself — directly for `MemoryStore`
// (synchronous), and through a connection owned by that thread for `RedisStore` /
// `PostgresStore` (a store-level "renewal channel"). Failing that, correct the guarantee: on a
// current-thread runtime the bound is the work of up to `event_interval` (61) task polls
// between two driver polls, whatever the round; advise `Builder::event_interval(1..=8)` or a
// multi-thread runtime.
/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
#[ignore = "known limit, documented (server docs, Renewal guarantee): on a current-thread runtime, tasks that wake each other delay timer reads to every 61 polls"]
fn a_handler_waiting_on_io_while_two_tasks_ping_pong_one_thread_memory() {
    scenario(
        Flavour::CurrentThread,
        memory,
        Work::Pending { for_: LEASE * 3 },
        (usize::MAX, Duration::from_millis(8)),
        1,
        false,
    )
    .assert_once(1);
}

// HELD. The same on a multi-thread runtime (2 workers): the ping-pong stays on one worker (its
// LIFO slot), the other polls the drivers and runs the ticker.
/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
fn a_handler_waiting_on_io_while_two_tasks_ping_pong_multi_thread_memory() {
    scenario(
        Flavour::MultiThread,
        memory,
        Work::Pending { for_: LEASE * 3 },
        (usize::MAX, Duration::from_millis(8)),
        1,
        false,
    )
    .assert_once(1);
}

// DEFECT (same root cause as the ping-pong test above, on the case the guarantee is written
// for). A keyed handler that yields (`yield_now`) after every 10 ms (0.025 lease) of work, on
// one thread with the same ping-pong pair. `yield_now` defers its wake until after the next
// driver poll, which the ping-pong puts 61 polls (~0.5 s) apart: the thread comes back to the
// handler about once per 1.2 leases, though by the docs' own reckoning (its stretch plus one
// turn of each busy task, 26 ms) it should come back every 0.065 lease. Seen: runs 2.
/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
#[ignore = "known limit, documented (server docs, Renewal guarantee): on a current-thread runtime, tasks that wake each other keep a yielding handler from its next poll for 61 polls"]
fn a_yielding_handler_while_two_tasks_ping_pong_one_thread_memory() {
    scenario(
        Flavour::CurrentThread,
        memory,
        // Six stretches: with the handler polled every ~0.5 s, about 3 s in all.
        Work::Busy {
            stretch: Duration::from_millis(10),
            stretches: 6,
        },
        (usize::MAX, Duration::from_millis(8)),
        1,
        false,
    )
    .assert_once(1);
}

// HELD: the diagnosis of the two ping-pong defects. The same two cases with the runtime's
// drivers polled every 4 task polls (`Builder::event_interval(4)`) keep their claims.
/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
fn ping_pong_cases_hold_with_event_interval_4() {
    scenario(
        Flavour::CurrentThreadEventInterval4,
        memory,
        Work::Pending { for_: LEASE * 3 },
        (usize::MAX, Duration::from_millis(8)),
        1,
        false,
    )
    .assert_once(1);
    scenario(
        Flavour::CurrentThreadEventInterval4,
        memory,
        Work::Busy {
            stretch: Duration::from_millis(10),
            stretches: 40,
        },
        (usize::MAX, Duration::from_millis(8)),
        1,
        false,
    )
    .assert_once(1);
}
