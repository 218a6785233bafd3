//! Cost per request in process: the bare service, `tower::retry::Retry` with a minimal policy
//! (clones the request, never retries), and this layer on a GET and a POST that succeed.
//! Measured interleaved in one run; prints medians, ratios and allocations per request.
//!
//! Run: `cargo bench --bench overhead`

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
use tower::retry::{Policy, Retry};
use tower::{Service, ServiceExt};
use tower_retry_safety::RetryPolicy;

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

type Req = Request<Full<Bytes>>;
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

/// The least a tower::retry policy does: keep a copy, never retry.
#[derive(Clone)]
struct CloneNeverRetry;

impl Policy<Req, Res, Infallible> for CloneNeverRetry {
    type Future = Ready<()>;

    fn retry(&mut self, _: &mut Req, _: &mut Result<Res, Infallible>) -> Option<Ready<()>> {
        None
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        let mut copy = Request::new(req.body().clone());
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        *copy.headers_mut() = req.headers().clone();
        Some(copy)
    }
}

fn request(method: Method) -> Req {
    Request::builder()
        .method(method)
        .uri("https://api.example.com/v1/tools/GMAIL_SEND_EMAIL/execute")
        .header("content-type", "application/json")
        .header("user-agent", "sdk/1.0")
        .body(Full::new(Bytes::from_static(b"{\"to\":\"a@example.com\"}")))
        .expect("valid request")
}

/// Sends one request through `svc` and drops the response.
async fn one<S>(svc: &mut S, method: Method)
where
    S: Service<Req, Response = Res>,
    S::Error: std::fmt::Debug,
{
    let res = svc
        .ready()
        .await
        .expect("ready")
        .call(request(method))
        .await;
    black_box(res.expect("ok"));
}

struct Variant {
    name: &'static str,
    samples: Vec<f64>,
    allocs: f64,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn size_of_future<S: Service<R>, R>(_: &S) -> usize {
    std::mem::size_of::<S::Future>()
}

macro_rules! measure {
    ($variant:expr, $batch:expr, $svc:expr, $method:expr) => {{
        let start = Instant::now();
        for _ in 0..$batch {
            one(&mut $svc, $method).await;
        }
        $variant
            .samples
            .push(start.elapsed().as_nanos() as f64 / $batch as f64);
    }};
}

macro_rules! count_allocs {
    ($svc:expr, $method:expr) => {{
        const N: u64 = 10_000;
        let before = ALLOCS.load(Ordering::Relaxed);
        for _ in 0..N {
            one(&mut $svc, $method).await;
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
    // The same without a budget: tokio's test-util clock (on in every dev build) makes the
    // budget's clock reads take a lock here that production builds do not take.
    let no_budget = RetryPolicy::builder().no_budget().build().expect("policy");
    let mut layer_no_budget = tower::Layer::layer(&no_budget, Instant200);

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
    ];

    // Warm up, then count allocations per request (request construction included, alike
    // for all; the bare figure is that baseline).
    for _ in 0..50_000 {
        one(&mut bare, Method::GET).await;
        one(&mut tower_retry, Method::GET).await;
        one(&mut layer, Method::GET).await;
    }
    v[0].allocs = count_allocs!(bare, Method::GET);
    v[1].allocs = count_allocs!(tower_retry, Method::GET);
    v[2].allocs = count_allocs!(layer, Method::GET);
    v[3].allocs = count_allocs!(layer, Method::POST);
    v[4].allocs = count_allocs!(layer_no_budget, Method::GET);

    let rounds = 301;
    let batch = 2_000;
    let deadline = Instant::now() + Duration::from_secs(60);
    for _ in 0..rounds {
        measure!(v[0], batch, bare, Method::GET);
        measure!(v[1], batch, tower_retry, Method::GET);
        measure!(v[2], batch, layer, Method::GET);
        measure!(v[3], batch, layer, Method::POST);
        measure!(v[4], batch, layer_no_budget, Method::GET);
        if Instant::now() > deadline {
            break;
        }
    }
    let med: Vec<f64> = v.iter_mut().map(|x| median(&mut x.samples)).collect();
    for (x, m) in v.iter().zip(&med) {
        println!(
            "{:<20} median {:>8.1} ns/request, {:>5.2} allocations/request",
            x.name, m, x.allocs
        );
    }
    println!("allocs layer_get {:.2}", v[2].allocs - v[0].allocs);
    println!("allocs layer_post {:.2}", v[3].allocs - v[0].allocs);
    println!("allocs tower_retry {:.2}", v[1].allocs - v[0].allocs);
    println!("ratio layer_get/tower_retry {:.3}", med[2] / med[1]);
    println!(
        "ratio layer_get_no_budget/tower_retry {:.3}",
        med[4] / med[1]
    );
    println!("ratio layer_post/tower_retry {:.3}", med[3] / med[1]);
    println!(
        "ratio layer_get/bare {:.3} (+{:.0} ns per request)",
        med[2] / med[0],
        med[2] - med[0]
    );
    println!(
        "size_of ResponseFuture (layer over an instant service) {} bytes; tower::retry future {} bytes",
        size_of_future::<_, Req>(&layer),
        size_of_future::<_, Req>(&tower_retry)
    );
}
