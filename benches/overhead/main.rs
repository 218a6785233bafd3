//! Cost per request in process: the bare service, `tower::retry::Retry` with a minimal policy
//! (clones the request, never retries), and this layer on a GET and a POST that succeed.
//! Measured interleaved in one run; prints medians, ratios and allocations per request. Then
//! the layer's throughput from two threads at once, with its default budget and without one,
//! and a budget deposit alone: `LockFreeBudget` against tower's `TpsBudget`.
//!
//! Run: `cargo bench --bench overhead`
//!
//! Instructions per request, free of timing noise: `OVERHEAD_ONLY=<variant>:<n>` sends `n` GETs
//! through one variant (`bare`, `tower_retry`, `floor`, `layer`, `layer_no_budget`,
//! `layer_tps`: the layer with tower's budget, `layer_spans_off`: the layer under a subscriber
//! that wants no INFO span, so its per-attempt spans are off) and nothing else, so under
//! `valgrind --tool=callgrind` the difference between `n` and `0` divided by `n` is the count
//! (`scripts/instructions.sh` does this for every variant).

use std::alloc::{GlobalAlloc, Layout, System};
use std::convert::Infallible;
use std::future::{ready, Ready};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::Full;
use tower::retry::budget::TpsBudget;
use tower::retry::Retry;
use tower::{Service, ServiceExt};
use tower_retry_safety::budget::LockFreeBudget;
use tower_retry_safety::{NoRetry, RetryPolicy, RetrySafety};

use floor::Floor;
use retry_safety_testing::bench::deposits::ns_per_deposit;
use retry_safety_testing::bench::threads::two_threads;
use retry_safety_testing::bench::{median, print_ratio, CloneNeverRetry, Req};

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

type Res = Response<Full<Bytes>>;

/// Answers at once.
#[derive(Clone)]
struct Instant200;

impl Service<Req> for Instant200 {
    type Response = Res;
    type Error = Infallible;
    type Future = Ready<Result<Res, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        black_box(&req);
        ready(Ok(Response::new(Full::new(Bytes::from_static(b"ok")))))
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Get,
    Post,
    /// A POST marked `NoRetry`: it can never be retried.
    NeverRetried,
}

fn request(kind: Kind) -> Req {
    let method = match kind {
        Kind::Get => Method::GET,
        Kind::Post | Kind::NeverRetried => Method::POST,
    };
    let mut req = Request::builder()
        .method(method)
        .uri("https://api.example.com/v1/tools/GMAIL_SEND_EMAIL/execute")
        .header("content-type", "application/json")
        .header("user-agent", "sdk/1.0")
        .body(Full::new(Bytes::from_static(b"{\"to\":\"a@example.com\"}")))
        .expect("valid request");
    if let Kind::NeverRetried = kind {
        req.extensions_mut().insert(NoRetry);
    }
    req
}

/// Sends one request through `svc` and drops the response.
async fn one<S>(svc: &mut S, kind: Kind)
where
    S: Service<Req, Response = Res>,
    S::Error: std::fmt::Debug,
{
    let res = svc.ready().await.expect("ready").call(request(kind)).await;
    black_box(res.expect("ok"));
}

/// A subscriber that wants no INFO span: the layer's per-attempt spans are off, as in a
/// service that logs at WARN.
fn spans_off() -> impl tracing::Subscriber + Send + Sync {
    use tracing_subscriber::layer::SubscriberExt;
    tracing_subscriber::registry().with(tracing_subscriber::filter::LevelFilter::WARN)
}

struct Variant {
    name: &'static str,
    samples: Vec<f64>,
    allocs: f64,
}

impl Variant {
    fn new(name: &'static str) -> Self {
        Variant {
            name,
            samples: vec![],
            allocs: 0.0,
        }
    }
}

fn size_of_future<S: Service<R>, R>(_: &S) -> usize {
    std::mem::size_of::<S::Future>()
}

macro_rules! measure {
    ($variant:expr, $batch:expr, $svc:expr, $kind:expr) => {{
        let start = std::time::Instant::now();
        for _ in 0..$batch {
            $crate::one(&mut $svc, $kind).await;
        }
        $variant
            .samples
            .push(start.elapsed().as_nanos() as f64 / $batch as f64);
    }};
}

macro_rules! count_allocs {
    ($svc:expr, $kind:expr) => {{
        const N: u64 = 10_000;
        let before = $crate::ALLOCS.load(std::sync::atomic::Ordering::Relaxed);
        for _ in 0..N {
            $crate::one(&mut $svc, $kind).await;
        }
        ($crate::ALLOCS.load(std::sync::atomic::Ordering::Relaxed) - before) as f64 / N as f64
    }};
}

// The modules after the macros, which they use.
mod floor;
#[cfg(feature = "opentelemetry")]
mod metrics;
mod only;
mod put;

/// The in-process stacks, each over a service that answers at once.
struct Stacks {
    bare: Instant200,
    tower_retry: Retry<CloneNeverRetry, Instant200>,
    /// The default policy, budget included.
    layer: RetrySafety<Instant200>,
    /// The same without a budget, and with tower's (the default before `LockFreeBudget`).
    layer_no_budget: RetrySafety<Instant200>,
    layer_tps: RetrySafety<Instant200>,
    floor: Floor<Instant200>,
}

impl Stacks {
    fn new(policy: &RetryPolicy) -> Self {
        let no_budget = RetryPolicy::builder().no_budget().build().expect("policy");
        let tps = RetryPolicy::builder()
            .tps_budget(Duration::from_secs(10), 10, 0.2)
            .build()
            .expect("policy");
        Stacks {
            bare: Instant200,
            tower_retry: Retry::new(CloneNeverRetry, Instant200),
            layer: tower::Layer::layer(policy, Instant200),
            layer_no_budget: tower::Layer::layer(&no_budget, Instant200),
            layer_tps: tower::Layer::layer(&tps, Instant200),
            floor: Floor::new(Instant200),
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let policy = RetryPolicy::builder().build().expect("default policy");
    let mut stacks = Stacks::new(&policy);
    if let Ok(only) = std::env::var("OVERHEAD_ONLY") {
        return only::run(&only, &policy, &mut stacks).await;
    }
    interleaved(&mut stacks).await;
    future_sizes(&policy, &stacks);
    two_threads_through_one_layer(&stacks);
    deposit_alone();
    put::stream_put(&policy).await;
    #[cfg(feature = "opentelemetry")]
    metrics::metrics_overhead().await;
}

/// Each stack's time and allocations per request, measured interleaved: medians, then
/// ratios of each round's own samples.
async fn interleaved(s: &mut Stacks) {
    let mut v = [
        "bare",
        "tower_retry",
        "layer_get",
        "layer_post",
        "layer_get_no_budget",
        "floor",
        "layer_get_tps",
        "layer_get_spans_off",
    ]
    .map(Variant::new);
    let never_retried = count_allocations(&mut v, s).await;
    let rounds = 301;
    let batch = 2_000;
    let deadline = Instant::now() + Duration::from_secs(60);
    for _ in 0..rounds {
        measure!(v[0], batch, s.bare, Kind::Get);
        measure!(v[1], batch, s.tower_retry, Kind::Get);
        measure!(v[2], batch, s.layer, Kind::Get);
        measure!(v[3], batch, s.layer, Kind::Post);
        measure!(v[4], batch, s.layer_no_budget, Kind::Get);
        measure!(v[5], batch, s.floor, Kind::Get);
        measure!(v[6], batch, s.layer_tps, Kind::Get);
        {
            let _off = tracing::subscriber::set_default(spans_off());
            measure!(v[7], batch, s.layer, Kind::Get);
        }
        if Instant::now() > deadline {
            break;
        }
    }
    print_interleaved(&mut v, never_retried);
}

/// Warms up, then counts allocations per request (request construction included, alike for
/// all; the bare figure is that baseline). Returns what a `NoRetry` POST adds through the
/// layer: the marker is the caller's allocation, so it is compared with the same request
/// sent bare.
async fn count_allocations(v: &mut [Variant; 8], s: &mut Stacks) -> f64 {
    for _ in 0..50_000 {
        one(&mut s.bare, Kind::Get).await;
        one(&mut s.tower_retry, Kind::Get).await;
        one(&mut s.layer, Kind::Get).await;
    }
    v[0].allocs = count_allocs!(s.bare, Kind::Get);
    v[1].allocs = count_allocs!(s.tower_retry, Kind::Get);
    v[2].allocs = count_allocs!(s.layer, Kind::Get);
    v[3].allocs = count_allocs!(s.layer, Kind::Post);
    v[4].allocs = count_allocs!(s.layer_no_budget, Kind::Get);
    v[5].allocs = count_allocs!(s.floor, Kind::Get);
    v[6].allocs = count_allocs!(s.layer_tps, Kind::Get);
    v[7].allocs = {
        let _off = tracing::subscriber::set_default(spans_off());
        count_allocs!(s.layer, Kind::Get)
    };
    let never_retried_bare = count_allocs!(s.bare, Kind::NeverRetried);
    let never_retried = count_allocs!(s.layer, Kind::NeverRetried);
    never_retried - never_retried_bare
}

fn print_interleaved(v: &mut [Variant; 8], never_retried: f64) {
    // Ratios first: each round's own, from the samples in the order they were taken.
    let samples: Vec<Vec<f64>> = v.iter().map(|x| x.samples.clone()).collect();
    let med: Vec<f64> = v.iter_mut().map(|x| median(&mut x.samples)).collect();
    for (x, m) in v.iter().zip(&med) {
        println!(
            "{:<20} median {:>8.1} ns/request, {:>5.2} allocations/request",
            x.name, m, x.allocs
        );
    }
    println!("allocs layer_get {}", v[2].allocs - v[0].allocs);
    println!("allocs layer_post {}", v[3].allocs - v[0].allocs);
    println!("allocs tower_retry {}", v[1].allocs - v[0].allocs);
    println!("allocs floor {}", v[5].allocs - v[0].allocs);
    println!("allocs layer_never_retried {never_retried}");
    let pair = |name: &str, num: usize, den: usize, more: &str| {
        print_ratio(name, &samples[num], &samples[den], more)
    };
    pair("layer_get/tower_retry", 2, 1, "");
    pair("layer_get_no_budget/tower_retry", 4, 1, "");
    pair("layer_post/tower_retry", 3, 1, "");
    pair("layer_get_tps/tower_retry", 6, 1, "");
    pair("layer_get_spans_off/layer_get", 7, 2, "");
    pair("floor/tower_retry", 5, 1, "");
    pair(
        "layer_get/floor",
        2,
        5,
        &format!(" (+{:.0} ns per request)", med[2] - med[5]),
    );
    pair(
        "layer_get/bare",
        2,
        0,
        &format!(" (+{:.0} ns per request)", med[2] - med[0]),
    );
}

fn future_sizes(policy: &RetryPolicy, s: &Stacks) {
    println!(
        "size_of ResponseFuture (layer over an instant service) {} bytes; tower::retry future {} bytes",
        size_of_future::<_, Req>(&s.layer),
        size_of_future::<_, Req>(&s.tower_retry)
    );
    // A typical stack: the layer, a per-attempt timeout, hyper-util's client.
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let typical = tower::ServiceBuilder::new()
        .layer(policy.clone())
        .timeout(Duration::from_secs(10))
        .service(client.clone());
    let typical_tower = tower::ServiceBuilder::new()
        .layer(tower::retry::RetryLayer::new(CloneNeverRetry))
        .timeout(Duration::from_secs(10))
        .service(client);
    println!(
        "size_of ResponseFuture (layer, timeout, hyper-util client) {} bytes; tower::retry in its place {} bytes",
        size_of_future::<_, Req>(&typical),
        size_of_future::<_, Req>(&typical_tower)
    );
}

/// Two threads through one layer at once (so one budget): the default budget, tower's, and
/// none. Each round runs the three back to back; the ratios are each round's, so that the
/// machine's load (shared, 2 cores here) weighs on both sides of each alike.
fn two_threads_through_one_layer(s: &Stacks) {
    let rounds = two_threads(
        &[
            s.layer.clone(),
            s.layer_tps.clone(),
            s.layer_no_budget.clone(),
        ],
        101,
        5_000,
        || request(Kind::Get),
    );
    let column = |i: usize| rounds.iter().map(|r| r[i]).collect::<Vec<_>>();
    let ratio_to_none = |i: usize| rounds.iter().map(|r| r[i] / r[2]).collect::<Vec<_>>();
    println!(
        "two threads, requests/s: layer {:.0}, with tower's TpsBudget {:.0}, no budget {:.0}",
        median(&mut column(0)),
        median(&mut column(1)),
        median(&mut column(2))
    );
    println!(
        "ratio layer_2threads/layer_2threads_no_budget {:.3}",
        median(&mut ratio_to_none(0))
    );
    println!(
        "ratio layer_2threads_tps_budget/layer_2threads_no_budget {:.3}",
        median(&mut ratio_to_none(1))
    );
}

/// A deposit alone, one thread, interleaved.
fn deposit_alone() {
    let (lock_free, tps_budget) = (LockFreeBudget::default(), TpsBudget::default());
    let (mut ours, mut theirs) = (vec![], vec![]);
    for _ in 0..101 {
        ours.push(ns_per_deposit(&lock_free, 10_000));
        theirs.push(ns_per_deposit(&tps_budget, 10_000));
    }
    let (a, b) = (median(&mut ours), median(&mut theirs));
    println!(
        "ratio budget_deposit/tps_budget_deposit {:.3} ({a:.1} ns / {b:.1} ns)",
        a / b
    );
}
