//! What the fault lab's proxy adds to a request when it injects nothing: the same GET sent
//! straight to an upstream, through a bare forwarding hop, and through `retry-safety-lab
//! proxy` with the `none` fault only, on loopback, in interleaved batches.
//!
//! - `ratio lab_passthrough/direct`: what a client pointed at the lab pays. Any reverse proxy
//!   is a hop of its own (it reads the request, forwards it on a connection of its own and
//!   reads the answer), so against an upstream that answers at once it adds about one more
//!   loopback round trip, whatever it does besides.
//! - `ratio bare_hop/direct`: that floor, measured: the least a forwarding hop built on the
//!   same stack does (hyper's server, hyper-util's pooled client, bodies read whole, nothing
//!   counted).
//! - `ratio lab_passthrough/bare_hop`: what the lab adds above the floor (identifying the
//!   operation, the route's kind, the ledger, the header filter).
//! - the `_1ms` rows: the same with 1 ms of work per request at the upstream, a fast real API.
//!
//! `cargo bench -p retry-safety-lab --bench lab`

use std::convert::Infallible;
use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use retry_safety_lab::{Fault, Proxy, ProxyConfig};
use tokio::net::TcpListener;

use retry_safety_testing::bench::{median, print_ratio};

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

/// An upstream that answers every request with a small JSON body after `work`.
async fn upstream(work: Duration) -> String {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = service_fn(move |_req: Request<Incoming>| async move {
                    if !work.is_zero() {
                        tokio::time::sleep(work).await;
                    }
                    let res = Response::builder()
                        .header("content-type", "application/json")
                        .body(Full::new(Bytes::from_static(b"{\"ok\":true}")))
                        .expect("response");
                    Ok::<_, Infallible>(res)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    format!("http://{addr}")
}

async fn get(client: &HttpClient, url: &str) {
    let req = Request::get(url)
        .header("x-request-id", "bench")
        .body(Full::new(Bytes::new()))
        .expect("valid request");
    let res = client.request(req).await.expect("a response");
    black_box(res.into_body().collect().await.expect("body"));
}

/// Mean nanoseconds per request over `n` requests.
async fn batch(client: &HttpClient, url: &str, n: u32) -> f64 {
    let start = Instant::now();
    for _ in 0..n {
        get(client, url).await;
    }
    start.elapsed().as_nanos() as f64 / f64::from(n)
}

/// The least a forwarding hop does: each request read whole and sent on to `upstream` with
/// its method, path and headers (but `host`), the answer read whole and passed back.
async fn bare_hop(upstream: String) -> String {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("addr");
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (client, upstream) = (client.clone(), upstream.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let (client, upstream) = (client.clone(), upstream.clone());
                    async move {
                        let (mut parts, body) = req.into_parts();
                        let body = body.collect().await.expect("request body").to_bytes();
                        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
                        parts.uri = format!("{upstream}{path}").parse().expect("uri");
                        parts.headers.remove(http::header::HOST);
                        let res = client
                            .request(Request::from_parts(parts, Full::new(body)))
                            .await
                            .expect("the upstream answers");
                        let (parts, body) = res.into_parts();
                        let body = body.collect().await.expect("response body").to_bytes();
                        Ok::<_, Infallible>(Response::from_parts(parts, Full::new(body)))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    format!("http://{addr}")
}

/// Direct, through the bare hop and through the lab, in batches whose order turns each
/// round; each ratio is the median of the rounds' own ratios.
async fn compare(suffix: &str, work: Duration, batch_size: u32, rounds: u32) {
    let direct = upstream(work).await;
    let hop = bare_hop(direct.clone()).await;
    let config = ProxyConfig::new(&direct)
        .expect("the upstream's URL")
        .faults(vec![Fault::None]);
    let proxy = Proxy::start(config, "127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("the proxy starts");
    let proxied = format!("http://{}", proxy.addr());
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let urls = [direct, hop, proxied].map(|base| format!("{base}/v1/things/1"));
    // Warm every path's connections.
    for url in &urls {
        batch(&client, url, 200).await;
    }
    // samples[path][round]: direct, bare hop, lab.
    let mut samples = [Vec::new(), Vec::new(), Vec::new()];
    for round in 0..rounds as usize {
        // The order turns: the later batches of a round ran faster on this machine.
        for i in 0..3 {
            let path = (round + i) % 3;
            samples[path].push(batch(&client, &urls[path], batch_size).await);
        }
    }
    let [d, h, p] = &samples;
    let us = |v: &[f64]| median_of(v) / 1e3;
    let per_request =
        |a: &[f64], b: &[f64]| format!(" ({:.1} µs against {:.1} µs per request)", us(a), us(b));
    print_ratio(
        &format!("lab_passthrough{suffix}/direct{suffix}"),
        p,
        d,
        &per_request(p, d),
    );
    print_ratio(
        &format!("bare_hop{suffix}/direct{suffix}"),
        h,
        d,
        &per_request(h, d),
    );
    print_ratio(
        &format!("lab_passthrough{suffix}/bare_hop{suffix}"),
        p,
        h,
        &per_request(p, h),
    );
}

fn median_of(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    median(&mut v)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    compare("", Duration::ZERO, 500, 41).await;
    compare("_1ms", Duration::from_millis(1), 50, 21).await;
}
