//! What the fault lab's proxy adds to a request when it injects nothing: the same GET sent
//! straight to an upstream and through `retry-safety-lab proxy` with the `none` fault only,
//! on loopback, in interleaved batches (`ratio lab_passthrough/direct`). The proxy is a hop
//! of its own (it reads the request, forwards it on a connection of its own, reads the answer
//! and counts it), so against an upstream that answers at once it adds about one more loopback
//! round trip; the second pair gives the upstream 1 ms of work per request, a fast real API
//! (`ratio lab_passthrough_1ms/direct_1ms`).
//!
//! `cargo bench --bench lab --features lab`

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
use tokio::net::TcpListener;
use tower_retry_safety::lab::{Fault, Proxy, ProxyConfig};

mod common;
use common::print_ratio;

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

/// Direct and proxied in alternating batches; the ratio of the rounds' medians.
async fn pair(name: &str, work: Duration, batch_size: u32, rounds: u32) {
    let direct = upstream(work).await;
    let config = ProxyConfig::new(&direct)
        .expect("the upstream's URL")
        .faults(vec![Fault::None]);
    let proxy = Proxy::start(config, "127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("the proxy starts");
    let proxied = format!("http://{}", proxy.addr());
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let (direct_url, proxied_url) = (
        format!("{direct}/v1/things/1"),
        format!("{proxied}/v1/things/1"),
    );
    // Warm both paths' connections.
    batch(&client, &direct_url, 200).await;
    batch(&client, &proxied_url, 200).await;
    let (mut d, mut p) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        // The order alternates: the second of a pair ran faster on this machine.
        if round % 2 == 0 {
            d.push(batch(&client, &direct_url, batch_size).await);
            p.push(batch(&client, &proxied_url, batch_size).await);
        } else {
            p.push(batch(&client, &proxied_url, batch_size).await);
            d.push(batch(&client, &direct_url, batch_size).await);
        }
    }
    let (md, mp) = (median_of(&d), median_of(&p));
    print_ratio(
        name,
        &p,
        &d,
        &format!(
            " ({:.1} µs against {:.1} µs per request)",
            mp / 1e3,
            md / 1e3
        ),
    );
}

fn median_of(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    common::median(&mut v)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    pair("lab_passthrough/direct", Duration::ZERO, 500, 41).await;
    pair(
        "lab_passthrough_1ms/direct_1ms",
        Duration::from_millis(1),
        50,
        21,
    )
    .await;
}
