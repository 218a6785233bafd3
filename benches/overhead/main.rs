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
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::Full;
use tower::retry::budget::{Budget, TpsBudget};
use tower::retry::{Policy, Retry};
use tower::{Service, ServiceExt};
use tower_retry_safety::{LockFreeBudget, NoRetry, RetryPolicy, RetryReport};

mod common;
use common::deposits::ns_per_deposit;
use common::threads::two_threads;
use common::{median, print_ratio, CloneNeverRetry, Req};

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

/// The least any layer meeting this crate's contract must add to `tower::retry`'s clone: the
/// attempt marker in the request's extensions (so an inner retry layer never compounds), a
/// report-sized value in the response's extensions (every response carries a `RetryReport`),
/// a deposit in the default budget (`LockFreeBudget`), and the clock read behind the first
/// attempt's time. No classification, no decision: a lower bound, not an alternative.
#[derive(Clone)]
struct Floor<S> {
    inner: S,
    budget: Arc<LockFreeBudget>,
}

#[derive(Clone)]
struct FloorMarker;

#[derive(Clone)]
#[allow(dead_code)] // only its size matters
struct FloorReport([u8; std::mem::size_of::<RetryReport>()]);

impl<S> Service<Req> for Floor<S>
where
    S: Service<Req, Response = Res>,
{
    type Response = Res;
    type Error = S::Error;
    type Future = FloorFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        self.budget.deposit();
        let started = SystemTime::now();
        let copy = Policy::<Req, Res, Infallible>::clone_request(&mut CloneNeverRetry, &req);
        req.extensions_mut().insert(FloorMarker);
        FloorFuture {
            future: self.inner.call(req),
            copy,
            started,
        }
    }
}

pin_project_lite::pin_project! {
    struct FloorFuture<F> {
        #[pin]
        future: F,
        copy: Option<Req>,
        started: SystemTime,
    }
}

impl<F, E> std::future::Future for FloorFuture<F>
where
    F: std::future::Future<Output = Result<Res, E>>,
{
    type Output = Result<Res, E>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut res = std::task::ready!(this.future.poll(cx))?;
        black_box(this.started);
        this.copy.take();
        res.extensions_mut()
            .insert(FloorReport([0; std::mem::size_of::<RetryReport>()]));
        Poll::Ready(Ok(res))
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

fn size_of_future<S: Service<R>, R>(_: &S) -> usize {
    std::mem::size_of::<S::Future>()
}

macro_rules! measure {
    ($variant:expr, $batch:expr, $svc:expr, $kind:expr) => {{
        let start = Instant::now();
        for _ in 0..$batch {
            one(&mut $svc, $kind).await;
        }
        $variant
            .samples
            .push(start.elapsed().as_nanos() as f64 / $batch as f64);
    }};
}

macro_rules! count_allocs {
    ($svc:expr, $kind:expr) => {{
        const N: u64 = 10_000;
        let before = ALLOCS.load(Ordering::Relaxed);
        for _ in 0..N {
            one(&mut $svc, $kind).await;
        }
        (ALLOCS.load(Ordering::Relaxed) - before) as f64 / N as f64
    }};
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut bare = Instant200;
    let mut tower_retry = Retry::new(CloneNeverRetry, Instant200);
    // The default policy, budget included.
    let policy = RetryPolicy::builder().build().expect("default policy");
    let mut layer = tower::Layer::layer(&policy, Instant200);
    // The same without a budget, and with tower's (the default before `LockFreeBudget`).
    let no_budget = RetryPolicy::builder().no_budget().build().expect("policy");
    let mut layer_no_budget = tower::Layer::layer(&no_budget, Instant200);
    let tps = RetryPolicy::builder()
        .tps_budget(Duration::from_secs(10), 10, 0.2)
        .build()
        .expect("policy");
    let mut layer_tps = tower::Layer::layer(&tps, Instant200);
    let mut floor = Floor {
        inner: Instant200,
        budget: Arc::new(LockFreeBudget::default()),
    };

    if let Ok(only) = std::env::var("OVERHEAD_ONLY") {
        let (variant, n) = only.split_once(':').expect("OVERHEAD_ONLY=<variant>:<n>");
        let n: u64 = n.parse().expect("a request count");
        if variant.ends_with("_put") {
            return put_only(&policy, variant, n).await;
        }
        #[cfg(feature = "opentelemetry")]
        if variant == "layer_metrics" || variant == "otel_floor" {
            return metrics_only(variant, n).await;
        }
        if variant.starts_with("deadline_") {
            return deadline_only(variant, n).await;
        }
        for _ in 0..n {
            match variant {
                "bare" => one(&mut bare, Kind::Get).await,
                "tower_retry" => one(&mut tower_retry, Kind::Get).await,
                "floor" => one(&mut floor, Kind::Get).await,
                "layer" => one(&mut layer, Kind::Get).await,
                "layer_post" => one(&mut layer, Kind::Post).await,
                "layer_no_budget" => one(&mut layer_no_budget, Kind::Get).await,
                "layer_tps" => one(&mut layer_tps, Kind::Get).await,
                "layer_spans_off" => {
                    let _off = tracing::subscriber::set_default(spans_off());
                    one(&mut layer, Kind::Get).await
                }
                other => panic!("unknown variant {other}"),
            }
        }
        return;
    }

    let mut v = [
        Variant {
            name: "bare",
            samples: vec![],
            allocs: 0.0,
        },
        Variant {
            name: "tower_retry",
            samples: vec![],
            allocs: 0.0,
        },
        Variant {
            name: "layer_get",
            samples: vec![],
            allocs: 0.0,
        },
        Variant {
            name: "layer_post",
            samples: vec![],
            allocs: 0.0,
        },
        Variant {
            name: "layer_get_no_budget",
            samples: vec![],
            allocs: 0.0,
        },
        Variant {
            name: "floor",
            samples: vec![],
            allocs: 0.0,
        },
        Variant {
            name: "layer_get_tps",
            samples: vec![],
            allocs: 0.0,
        },
        Variant {
            name: "layer_get_spans_off",
            samples: vec![],
            allocs: 0.0,
        },
    ];

    // Warm up, then count allocations per request (request construction included, alike
    // for all; the bare figure is that baseline).
    for _ in 0..50_000 {
        one(&mut bare, Kind::Get).await;
        one(&mut tower_retry, Kind::Get).await;
        one(&mut layer, Kind::Get).await;
    }
    v[0].allocs = count_allocs!(bare, Kind::Get);
    v[1].allocs = count_allocs!(tower_retry, Kind::Get);
    v[2].allocs = count_allocs!(layer, Kind::Get);
    v[3].allocs = count_allocs!(layer, Kind::Post);
    v[4].allocs = count_allocs!(layer_no_budget, Kind::Get);
    v[5].allocs = count_allocs!(floor, Kind::Get);
    v[6].allocs = count_allocs!(layer_tps, Kind::Get);
    v[7].allocs = {
        let _off = tracing::subscriber::set_default(spans_off());
        count_allocs!(layer, Kind::Get)
    };
    // The marker is the caller's allocation: compare with the same request sent bare.
    let never_retried_bare = count_allocs!(bare, Kind::NeverRetried);
    let never_retried = count_allocs!(layer, Kind::NeverRetried);

    let rounds = 301;
    let batch = 2_000;
    let deadline = Instant::now() + Duration::from_secs(60);
    for _ in 0..rounds {
        measure!(v[0], batch, bare, Kind::Get);
        measure!(v[1], batch, tower_retry, Kind::Get);
        measure!(v[2], batch, layer, Kind::Get);
        measure!(v[3], batch, layer, Kind::Post);
        measure!(v[4], batch, layer_no_budget, Kind::Get);
        measure!(v[5], batch, floor, Kind::Get);
        measure!(v[6], batch, layer_tps, Kind::Get);
        {
            let _off = tracing::subscriber::set_default(spans_off());
            measure!(v[7], batch, layer, Kind::Get);
        }
        if Instant::now() > deadline {
            break;
        }
    }
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
    println!(
        "allocs layer_never_retried {}",
        never_retried - never_retried_bare
    );
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
    println!(
        "size_of ResponseFuture (layer over an instant service) {} bytes; tower::retry future {} bytes",
        size_of_future::<_, Req>(&layer),
        size_of_future::<_, Req>(&tower_retry)
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

    // Two threads through one layer at once (so one budget): the default budget, tower's,
    // and none. Each round runs the three back to back; the ratios are each round's, so that
    // the machine's load (shared, 2 cores here) weighs on both sides of each alike.
    let rounds = two_threads(
        &[layer.clone(), layer_tps.clone(), layer_no_budget.clone()],
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

    // A deposit alone, one thread, interleaved.
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

    stream_put(&policy).await;
    #[cfg(feature = "opentelemetry")]
    metrics_overhead().await;
}

/// The layer recording in an SDK meter (the OpenTelemetry SDK's own aggregation, a reader
/// that does not export during the run) against the same policy without a meter,
/// interleaved. Run with `--features opentelemetry`.
#[cfg(feature = "opentelemetry")]
async fn metrics_overhead() {
    use opentelemetry::metrics::MeterProvider;
    use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};

    let reader = PeriodicReader::builder(InMemoryMetricExporter::default())
        .with_interval(Duration::from_secs(3600))
        .build();
    let provider = SdkMeterProvider::builder().with_reader(reader).build();
    let plain = RetryPolicy::builder().build().expect("policy");
    let metered = RetryPolicy::builder()
        .meter(provider.meter("overhead"))
        .build()
        .expect("policy");
    let mut layer = tower::Layer::layer(&plain, Instant200);
    let mut layer_metrics = tower::Layer::layer(&metered, Instant200);
    let mut v = [
        Variant {
            name: "layer_get",
            samples: vec![],
            allocs: 0.0,
        },
        Variant {
            name: "layer_get_metrics",
            samples: vec![],
            allocs: 0.0,
        },
    ];
    for _ in 0..50_000 {
        one(&mut layer, Kind::Get).await;
        one(&mut layer_metrics, Kind::Get).await;
    }
    v[0].allocs = count_allocs!(layer, Kind::Get);
    v[1].allocs = count_allocs!(layer_metrics, Kind::Get);
    let deadline = Instant::now() + Duration::from_secs(30);
    for _ in 0..201 {
        measure!(v[0], 2_000, layer, Kind::Get);
        measure!(v[1], 2_000, layer_metrics, Kind::Get);
        if Instant::now() > deadline {
            break;
        }
    }
    let samples: Vec<Vec<f64>> = v.iter().map(|x| x.samples.clone()).collect();
    let med: Vec<f64> = v.iter_mut().map(|x| median(&mut x.samples)).collect();
    print_ratio(
        "layer_get_metrics/layer_get",
        &samples[1],
        &samples[0],
        &format!(" (+{:.0} ns per request)", med[1] - med[0]),
    );
    println!("allocs layer_get_metrics {}", v[1].allocs - v[0].allocs);
    drop(provider);
}

/// `OVERHEAD_ONLY=deadline_<kind>:<n>`: `n` GETs with a deadline of the policy's own
/// (`deadline_own`), the same inside a handler's inbound deadline and handing it on to the
/// host (`deadline_carried`: the inbound deadline read, the time left and the attempt's
/// number written), and a policy that inherits nothing outside any scope
/// (`deadline_off`, against the default's `layer`: what reading the task-local costs).
async fn deadline_only(variant: &str, n: u64) {
    use tower_retry_safety::deadline::{self, Inbound};
    let own = || RetryPolicy::builder().deadline(Duration::from_secs(30));
    let policy = match variant {
        "deadline_own" => own().build(),
        "deadline_carried" => own().send_deadline_to("api.example.com").build(),
        "deadline_off" => RetryPolicy::builder().inherit_deadline(None).build(),
        other => panic!("unknown variant {other}"),
    }
    .expect("policy");
    let mut layer = tower::Layer::layer(&policy, Instant200);
    let calls = async move {
        for _ in 0..n {
            one(&mut layer, Kind::Get).await;
        }
    };
    if variant == "deadline_carried" {
        // One scope for the whole run, as a server sets one per handler.
        deadline::scope(Inbound::within(Duration::from_secs(60)), calls).await;
    } else {
        calls.await;
    }
}

/// `OVERHEAD_ONLY=layer_metrics:<n>`: `n` GETs through a layer recording in an SDK meter.
/// `OVERHEAD_ONLY=otel_floor:<n>`: the SDK's own floor for the same requests, with no layer:
/// one histogram record per request with the attributes the layer gives a plain GET's end
/// (method, verdict source, stop reason, host), built once, into the same SDK: the record
/// alone, the yardstick of this crate's own share.
#[cfg(feature = "opentelemetry")]
async fn metrics_only(variant: &str, n: u64) {
    use opentelemetry::metrics::MeterProvider;
    use opentelemetry::KeyValue;
    use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};

    let reader = PeriodicReader::builder(InMemoryMetricExporter::default())
        .with_interval(Duration::from_secs(3600))
        .build();
    let provider = SdkMeterProvider::builder().with_reader(reader).build();
    let meter = provider.meter("overhead");
    if variant == "otel_floor" {
        let histogram = meter
            .u64_histogram("floor.attempts")
            .with_boundaries(vec![1.0, 2.0, 3.0, 4.0, 5.0])
            .build();
        // Built once: the SDK's record alone, nothing of ours.
        let attributes = [
            KeyValue::new("http.request.method", "GET"),
            KeyValue::new("retry_safety.verdict_source", "method"),
            KeyValue::new("retry_safety.stop_reason", "final"),
            KeyValue::new("server.address", "api.example.com"),
        ];
        for _ in 0..n {
            histogram.record(black_box(1), black_box(&attributes));
        }
    } else {
        let metered = RetryPolicy::builder().meter(meter).build().expect("policy");
        let mut layer = tower::Layer::layer(&metered, Instant200);
        for _ in 0..n {
            one(&mut layer, Kind::Get).await;
        }
    }
    drop(provider);
}

const PUT_LEN: usize = 16 * 1024;
const PUT_CHUNK: usize = 4 * 1024;

/// Reads each request's body to its end, as a transport would, and answers 200.
#[derive(Clone)]
struct Drain;

impl<B> Service<Request<B>> for Drain
where
    B: http_body::Body + Unpin,
    B::Error: std::fmt::Debug,
{
    type Response = Res;
    type Error = Infallible;
    type Future = Ready<Result<Res, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        use bytes::Buf;
        // Both bodies here are ready at once: polled with a no-op waker, as hyper would.
        let mut body = req.into_body();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut read = 0;
        while let Poll::Ready(Some(frame)) = std::pin::Pin::new(&mut body).poll_frame(&mut cx) {
            read += frame
                .expect("frame")
                .data_ref()
                .map_or(0, |d| d.remaining());
        }
        assert_eq!(read, PUT_LEN);
        ready(Ok(Response::new(Full::new(Bytes::from_static(b"ok")))))
    }
}

type StreamReq = Request<http_body_util::combinators::BoxBody<Bytes, Infallible>>;

/// A 16 KiB PUT in 4 KiB chunks, streamed: the layer records it as it is read.
fn stream_put_request(chunks: &[Bytes]) -> StreamReq {
    use http_body_util::BodyExt;
    let frames: Vec<Result<http_body::Frame<Bytes>, Infallible>> = chunks
        .iter()
        .map(|c| Ok(http_body::Frame::data(c.clone())))
        .collect();
    let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames)).boxed();
    Request::put("https://api.example.com/v1/files/1")
        .body(body)
        .expect("valid request")
}

/// The same PUT as one `Full<Bytes>`: the layer keeps a copy (a handle) of it.
fn full_put_request(whole: &Bytes) -> Req {
    Request::put("https://api.example.com/v1/files/1")
        .body(Full::new(whole.clone()))
        .expect("valid request")
}

async fn send_put<S, B>(svc: &mut S, req: Request<B>)
where
    S: Service<Request<B>, Response = Res>,
    S::Error: std::fmt::Debug,
{
    let res = ServiceExt::<Request<B>>::ready(svc)
        .await
        .expect("ready")
        .call(req)
        .await;
    black_box(res.expect("ok"));
}

/// `n` 16 KiB PUTs through one variant, for instruction counts: `stream_put` and `full_put`
/// (through the layer), `bare_stream_put` and `bare_full_put` (without it).
async fn put_only(policy: &RetryPolicy, variant: &str, n: u64) {
    let whole = Bytes::from(vec![7u8; PUT_LEN]);
    let chunks: Vec<Bytes> = (0..PUT_LEN / PUT_CHUNK)
        .map(|i| whole.slice(i * PUT_CHUNK..(i + 1) * PUT_CHUNK))
        .collect();
    let mut layer = tower::Layer::layer(policy, Drain);
    let mut bare = Drain;
    for _ in 0..n {
        match variant {
            "stream_put" => send_put(&mut layer, stream_put_request(&chunks)).await,
            "full_put" => send_put(&mut layer, full_put_request(&whole)).await,
            "bare_stream_put" => send_put(&mut bare, stream_put_request(&chunks)).await,
            "bare_full_put" => send_put(&mut bare, full_put_request(&whole)).await,
            other => panic!("unknown variant {other}"),
        }
    }
}

/// A 16 KiB PUT through the layer as a stream body (recorded as it is read) against the same
/// PUT as `Full<Bytes>` (copied as a handle), both read to the end by the inner service.
async fn stream_put(policy: &RetryPolicy) {
    let whole = Bytes::from(vec![7u8; PUT_LEN]);
    let chunks: Vec<Bytes> = (0..PUT_LEN / PUT_CHUNK)
        .map(|i| whole.slice(i * PUT_CHUNK..(i + 1) * PUT_CHUNK))
        .collect();
    let mut stream_layer = tower::Layer::layer(policy, Drain);
    let mut full_layer = tower::Layer::layer(policy, Drain);
    let (mut stream_bare, mut full_bare) = (Drain, Drain);
    macro_rules! put {
        ($svc:expr, $req:expr) => {{
            send_put(&mut $svc, $req).await
        }};
    }
    macro_rules! allocs {
        ($svc:expr, $req:expr) => {{
            const N: u64 = 10_000;
            let before = ALLOCS.load(Ordering::Relaxed);
            for _ in 0..N {
                put!($svc, $req);
            }
            (ALLOCS.load(Ordering::Relaxed) - before) as f64 / N as f64
        }};
    }
    for _ in 0..20_000 {
        put!(stream_layer, stream_put_request(&chunks));
        put!(full_layer, full_put_request(&whole));
    }
    let stream_allocs = allocs!(stream_layer, stream_put_request(&chunks));
    let stream_bare_allocs = allocs!(stream_bare, stream_put_request(&chunks));
    let full_allocs = allocs!(full_layer, full_put_request(&whole));
    let (mut stream, mut full, mut bare, mut bare_full) = (vec![], vec![], vec![], vec![]);
    let batch = 2_000;
    let deadline = Instant::now() + Duration::from_secs(30);
    for _ in 0..201 {
        let start = Instant::now();
        for _ in 0..batch {
            put!(stream_layer, stream_put_request(&chunks));
        }
        stream.push(start.elapsed().as_nanos() as f64 / batch as f64);
        let start = Instant::now();
        for _ in 0..batch {
            put!(full_layer, full_put_request(&whole));
        }
        full.push(start.elapsed().as_nanos() as f64 / batch as f64);
        let start = Instant::now();
        for _ in 0..batch {
            put!(stream_bare, stream_put_request(&chunks));
        }
        bare.push(start.elapsed().as_nanos() as f64 / batch as f64);
        let start = Instant::now();
        for _ in 0..batch {
            put!(full_bare, full_put_request(&whole));
        }
        bare_full.push(start.elapsed().as_nanos() as f64 / batch as f64);
        if Instant::now() > deadline {
            break;
        }
    }
    // Each round's ratios, before the medians sort the samples.
    print_ratio("layer_stream_put/layer_full_put", &stream, &full, "");
    print_ratio("layer_stream_put/bare_stream_put", &stream, &bare, "");
    // What the stream costs before any layer: building it and reading it frame by frame.
    print_ratio("bare_stream_put/bare_full_put", &bare, &bare_full, "");
    // The recording's own cost: how much more a stream costs than `Full` through the layer,
    // over how much more it costs without it.
    let with_layer: Vec<f64> = stream.iter().zip(&full).map(|(s, f)| s / f).collect();
    let without: Vec<f64> = bare.iter().zip(&bare_full).map(|(s, f)| s / f).collect();
    print_ratio("recording_overhead", &with_layer, &without, "");
    let (stream, full, bare) = (median(&mut stream), median(&mut full), median(&mut bare));
    let bare_full = median(&mut bare_full);
    println!(
        "16 KiB PUT, median ns/request: layer as a stream {stream:.1}, layer as Full {full:.1}, \
         stream without the layer {bare:.1}, Full without the layer {bare_full:.1}"
    );
    println!(
        "allocations/request: layer as a stream {stream_allocs:.2} (the recording: {:.2} over \
         the stream without the layer), layer as Full {full_allocs:.2}",
        stream_allocs - stream_bare_allocs
    );
    println!(
        "layer's cost: +{:.0} ns on the stream (recording included), +{:.0} ns on Full",
        stream - bare,
        full - bare_full
    );
}
