//! Tail latency with and without hedging, against a hyper server on 127.0.0.1 with a heavy
//! tail: each request (each attempt) takes 50 ms with probability 1/20, else 1 ms (tokio's
//! timer: 1–2 ms). Sequential GETs through hyper-util's client: the layer without hedging,
//! with `Hedge::learned().max_extra_load(0.05)`, with `Hedge::fixed(5 ms)`, and tower's
//! `hedge` with a fixed delay (its histogram pre-filled with 5 ms and never rotated). Each
//! variant warms up first (not measured). Load = requests the server saw / requests sent.
//!
//! Run: `cargo bench --bench hedge` (about 20 s). `HEDGE_REQUESTS` changes the count.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{Layer, Service, ServiceExt};
use tower_retry_safety::{Hedge, RetryPolicy};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

const WARM_UP: usize = 300;

/// The server: counts requests; draws each one's latency from a fixed sequence.
async fn server(seen: Arc<AtomicU64>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |_req: Request<Incoming>| {
                    let n = seen.fetch_add(1, Ordering::Relaxed);
                    async move {
                        let slow = splitmix(n).is_multiple_of(20);
                        let ms = if slow { 50 } else { 1 };
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    format!("http://{addr}/v1/items")
}

/// A fixed pseudo-random sequence: every run draws the same tail.
fn splitmix(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

#[derive(Clone)]
struct CloneAll;

impl tower::hedge::Policy<Request<Full<Bytes>>> for CloneAll {
    fn clone_request(&self, req: &Request<Full<Bytes>>) -> Option<Request<Full<Bytes>>> {
        let mut copy = Request::new(req.body().clone());
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        Some(copy)
    }
    fn can_retry(&self, _: &Request<Full<Bytes>>) -> bool {
        true
    }
}

struct Run {
    p50: f64,
    p99: f64,
    p999: f64,
    load: f64,
}

/// Sends `n` GETs one after another (after the warm-up); latencies in ms and the load.
async fn measure<S, E>(mut svc: S, url: &str, seen: &AtomicU64, n: usize) -> Run
where
    S: Service<Request<Full<Bytes>>, Response = Response<Incoming>, Error = E>,
    E: std::fmt::Debug,
{
    let mut times = Vec::with_capacity(n);
    let mut before = 0;
    for i in 0..WARM_UP + n {
        if i == WARM_UP {
            before = seen.load(Ordering::Relaxed);
        }
        let req = Request::get(url)
            .body(Full::new(Bytes::new()))
            .expect("request");
        let start = Instant::now();
        let res = svc
            .ready()
            .await
            .expect("ready")
            .call(req)
            .await
            .expect("ok");
        res.into_body().collect().await.expect("body");
        if i >= WARM_UP {
            times.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    // Let the losers' connections close before counting.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let sent = seen.load(Ordering::Relaxed) - before;
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
    Run {
        p50: at(0.5),
        p99: at(0.99),
        p999: at(0.999),
        load: sent as f64 / n as f64,
    }
}

fn print(name: &str, r: &Run) {
    println!(
        "{name:<18} p50 {:>6.2} ms  p99 {:>6.2} ms  p99.9 {:>6.2} ms  load {:.3}",
        r.p50, r.p99, r.p999, r.load
    );
}

fn main() {
    let n: usize = std::env::var("HEDGE_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let seen = Arc::new(AtomicU64::new(0));
        let url = server(seen.clone()).await;
        // Hedging is opt-in: the default policy's retry budget stays, as a user would have it.
        let plain = RetryPolicy::builder().build().expect("policy");
        let none = measure(plain.layer(client()), &url, &seen, n).await;
        let learned = RetryPolicy::builder()
            .hedge(Hedge::learned().max_extra_load(0.05))
            .build()
            .expect("policy");
        let hedge = measure(learned.layer(client()), &url, &seen, n).await;
        let fixed = RetryPolicy::builder()
            .hedge(Hedge::fixed(Duration::from_millis(5)).max_extra_load(0.05))
            .build()
            .expect("policy");
        let fixed = measure(fixed.layer(client()), &url, &seen, n).await;
        let tower = tower::hedge::Hedge::new_with_mock_latencies(
            client(),
            CloneAll,
            10,
            0.95,
            Duration::from_secs(3600),
            &[5; 100],
        );
        let tower = measure(tower, &url, &seen, n).await;
        println!("{n} sequential GETs, 1 in 20 attempts takes 50 ms, the rest 1 ms");
        print("no_hedge", &none);
        print("hedge_learned_5pct", &hedge);
        print("hedge_fixed_5ms", &fixed);
        print("tower_hedge_5ms", &tower);
        println!("ratio hedge_p99/no_hedge_p99 {:.3}", hedge.p99 / none.p99);
        println!(
            "ratio hedge_p999/no_hedge_p999 {:.3}",
            hedge.p999 / none.p999
        );
        println!(
            "ratio hedge_load/no_hedge_load {:.3}",
            hedge.load / none.load
        );
        println!(
            "ratio hedge_fixed_p99/no_hedge_p99 {:.3}",
            fixed.p99 / none.p99
        );
        println!(
            "ratio hedge_fixed_load/no_hedge_load {:.3}",
            fixed.load / none.load
        );
        println!(
            "ratio tower_hedge_p99/no_hedge_p99 {:.3}",
            tower.p99 / none.p99
        );
        println!(
            "ratio tower_hedge_load/no_hedge_load {:.3}",
            tower.load / none.load
        );
    });
}
