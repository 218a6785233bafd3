//! Cost per request over a real connection: a hyper server on 127.0.0.1, requests over
//! keep-alive. hyper-util's client bare, with `tower::retry` keeping a copy (the least any
//! retry layer does) and with this layer; with the `reqwest-middleware`
//! feature, reqwest with `RetrySafetyMiddleware` and with reqwest-retry's
//! `RetryTransientMiddleware`. Interleaved batches, medians, ratios. Bodies cut mid-way: a
//! 16 KiB GET and a 1 MiB streamed GET through the layer with `ReadWholeLayer` inside it,
//! against the same layer without it (`loopback_read_whole`, `loopback_read_whole_1m`).
//!
//! Run: `cargo bench --bench loopback --features reqwest-middleware`
//!
//! Instructions per request, client and server together (one thread), free of timing noise:
//! `LOOPBACK_ONLY=<row>:<n>` sends 20 requests to warm the row, then `n` more, and nothing
//! else (`scripts/loopback-instructions.sh` runs it under callgrind). Rows: `bare`, `layer`,
//! `tower_retry`, `layer_16k`, `read_whole_16k`, `layer_1m`, `read_whole_1m`, and with the
//! `reqwest-middleware` feature `reqwest_mw_layer` and `reqwest_retry`.

use std::convert::Infallible;
use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::retry::Retry;
use tower::{Service, ServiceExt};
use tower_retry_safety::resume::{ReadWhole, ReadWholeLayer};
use tower_retry_safety::{RetryPolicy, RetrySafety};

use retry_safety_testing::batch;
use retry_safety_testing::bench::{median, print_ratio, CloneNeverRetry};

async fn server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = service_fn(|req: Request<Incoming>| async move {
                    let body = match req.uri().path() {
                        "/v1/files/16k" => Bytes::from(vec![7u8; 16 * 1024]),
                        "/v1/files/1m" => Bytes::from(vec![7u8; 1024 * 1024]),
                        _ => Bytes::from_static(b"ok"),
                    };
                    let res = Response::builder()
                        .header("etag", "\"v1\"")
                        .body(Full::new(body))
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

fn request(url: &str) -> Request<Full<Bytes>> {
    Request::get(url)
        .header("user-agent", "bench")
        .body(Full::new(Bytes::new()))
        .expect("valid request")
}

async fn tower_one<S, E, B>(svc: &mut S, url: &str)
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>, Error = E>,
    E: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let res = svc
        .ready()
        .await
        .expect("ready")
        .call(request(url))
        .await
        .expect("ok");
    black_box(res.into_body().collect().await.expect("body"));
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Every row's stack and the URLs they ask for.
struct Rows {
    url: String,
    url_16k: String,
    url_1m: String,
    bare: HttpClient,
    tower_retry: Retry<CloneNeverRetry, HttpClient>,
    layered: RetrySafety<HttpClient>,
    layered_16k: RetrySafety<HttpClient>,
    read_whole_16k: RetrySafety<ReadWhole<HttpClient>>,
    layered_1m: RetrySafety<HttpClient>,
    read_whole_1m: RetrySafety<ReadWhole<HttpClient>>,
    #[cfg(feature = "reqwest-middleware")]
    ours: reqwest_middleware::ClientWithMiddleware,
    #[cfg(feature = "reqwest-middleware")]
    reference: reqwest_middleware::ClientWithMiddleware,
}

impl Rows {
    async fn new() -> Self {
        let base = server().await;
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        // Each body-size row on a client (a connection pool) of its own: with one pool,
        // whichever row ran first after the body size changed paid 20-30 % (hyper adapts a
        // connection's read buffer to the bodies it reads).
        let own_client = || Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let policy = || RetryPolicy::builder().build().expect("default policy");
        let layered_with = |client| tower::Layer::layer(&policy(), client);
        let read_whole_with = |client| {
            tower::ServiceBuilder::new()
                .layer(policy())
                .layer(ReadWholeLayer::new())
                .service(client)
        };
        Rows {
            url: format!("{base}/v1/things/1"),
            url_16k: format!("{base}/v1/files/16k"),
            url_1m: format!("{base}/v1/files/1m"),
            layered_16k: layered_with(own_client()),
            read_whole_16k: read_whole_with(own_client()),
            layered_1m: layered_with(own_client()),
            read_whole_1m: read_whole_with(own_client()),
            bare: client.clone(),
            tower_retry: Retry::new(CloneNeverRetry, client.clone()),
            layered: tower::Layer::layer(&policy(), client),
            #[cfg(feature = "reqwest-middleware")]
            ours: reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
                .with(tower_retry_safety::RetrySafetyMiddleware::new(policy()))
                .build(),
            #[cfg(feature = "reqwest-middleware")]
            reference: reqwest_retry_client(),
        }
    }

    /// `LOOPBACK_ONLY=<row>:<n>`: 20 requests to warm the row, then `n`, through one row.
    async fn only(&mut self, only: &str) {
        let (row, n) = only.split_once(':').expect("LOOPBACK_ONLY=<row>:<n>");
        let n: usize = n.parse().expect("a request count");
        let (url, url_16k, url_1m) = (&self.url, &self.url_16k, &self.url_1m);
        for _ in 0..20 + n {
            match row {
                "bare" => tower_one(&mut self.bare, url).await,
                "layer" => tower_one(&mut self.layered, url).await,
                "tower_retry" => tower_one(&mut self.tower_retry, url).await,
                "layer_16k" => tower_one(&mut self.layered_16k, url_16k).await,
                "read_whole_16k" => tower_one(&mut self.read_whole_16k, url_16k).await,
                "layer_1m" => tower_one(&mut self.layered_1m, url_1m).await,
                "read_whole_1m" => tower_one(&mut self.read_whole_1m, url_1m).await,
                #[cfg(feature = "reqwest-middleware")]
                "reqwest_mw_layer" => reqwest_one(&self.ours, url).await,
                #[cfg(feature = "reqwest-middleware")]
                "reqwest_retry" => reqwest_one(&self.reference, url).await,
                other => panic!("no row {other}"),
            }
        }
    }

    /// 2,000 requests through every row.
    async fn warm(&mut self) {
        let (url, url_16k, url_1m) = (&self.url, &self.url_16k, &self.url_1m);
        for _ in 0..2_000 {
            tower_one(&mut self.layered_16k, url_16k).await;
            tower_one(&mut self.read_whole_16k, url_16k).await;
            tower_one(&mut self.layered_1m, url_1m).await;
            tower_one(&mut self.read_whole_1m, url_1m).await;
            tower_one(&mut self.bare, url).await;
            tower_one(&mut self.layered, url).await;
            tower_one(&mut self.tower_retry, url).await;
            #[cfg(feature = "reqwest-middleware")]
            {
                reqwest_one(&self.ours, url).await;
                reqwest_one(&self.reference, url).await;
            }
        }
    }
}

/// reqwest with reqwest-retry's `RetryTransientMiddleware`, the reference.
#[cfg(feature = "reqwest-middleware")]
fn reqwest_retry_client() -> reqwest_middleware::ClientWithMiddleware {
    let policy = reqwest_retry::policies::ExponentialBackoff::builder().build_with_max_retries(2);
    reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(reqwest_retry::RetryTransientMiddleware::new_with_policy(
            policy,
        ))
        .build()
}

#[cfg(feature = "reqwest-middleware")]
async fn reqwest_one(client: &reqwest_middleware::ClientWithMiddleware, url: &str) {
    let res = client
        .get(url)
        .header("user-agent", "bench")
        .send()
        .await
        .expect("ok");
    black_box(res.bytes().await.expect("body"));
}

/// Each row's samples, in `report`'s order.
#[derive(Default)]
struct Samples {
    bare: Vec<f64>,
    layered: Vec<f64>,
    tower_retry: Vec<f64>,
    layered_16k: Vec<f64>,
    read_whole_16k: Vec<f64>,
    layered_1m: Vec<f64>,
    read_whole_1m: Vec<f64>,
    ours: Vec<f64>,
    reference: Vec<f64>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut rows = Rows::new().await;
    if let Ok(only) = std::env::var("LOOPBACK_ONLY") {
        return rows.only(&only).await;
    }
    rows.warm().await;
    let samples = interleaved(&mut rows).await;
    report(samples);
}

/// Up to 101 rounds of every row, 90 s at most.
async fn interleaved(r: &mut Rows) -> Samples {
    let mut s = Samples::default();
    let (url, url_16k, url_1m) = (&r.url, &r.url_16k, &r.url_1m);
    let deadline = Instant::now() + Duration::from_secs(90);
    for round in 0..101 {
        batch!(s.bare, 200, tower_one(&mut r.bare, url).await);
        batch!(s.layered, 200, tower_one(&mut r.layered, url).await);
        batch!(s.tower_retry, 200, tower_one(&mut r.tower_retry, url).await);
        // Of each pair, whichever runs second was measured 10-45 % faster (1 MiB bodies): the
        // order alternates from round to round.
        if round % 2 == 0 {
            batch!(
                s.layered_16k,
                100,
                tower_one(&mut r.layered_16k, url_16k).await
            );
            batch!(
                s.read_whole_16k,
                100,
                tower_one(&mut r.read_whole_16k, url_16k).await
            );
            batch!(s.layered_1m, 10, tower_one(&mut r.layered_1m, url_1m).await);
            batch!(
                s.read_whole_1m,
                10,
                tower_one(&mut r.read_whole_1m, url_1m).await
            );
        } else {
            batch!(
                s.read_whole_16k,
                100,
                tower_one(&mut r.read_whole_16k, url_16k).await
            );
            batch!(
                s.layered_16k,
                100,
                tower_one(&mut r.layered_16k, url_16k).await
            );
            batch!(
                s.read_whole_1m,
                10,
                tower_one(&mut r.read_whole_1m, url_1m).await
            );
            batch!(s.layered_1m, 10, tower_one(&mut r.layered_1m, url_1m).await);
        }
        #[cfg(feature = "reqwest-middleware")]
        {
            batch!(s.ours, 200, reqwest_one(&r.ours, url).await);
            batch!(s.reference, 200, reqwest_one(&r.reference, url).await);
        }
        if Instant::now() > deadline {
            break;
        }
    }
    s
}

/// Each round's ratios, before the medians sort the samples; then the medians.
fn report(mut s: Samples) {
    print_ratio("loopback_layer/loopback_bare", &s.layered, &s.bare, "");
    print_ratio(
        "loopback_tower_retry/loopback_bare",
        &s.tower_retry,
        &s.bare,
        "",
    );
    print_ratio(
        "loopback_layer/loopback_tower_retry",
        &s.layered,
        &s.tower_retry,
        "",
    );
    print_ratio(
        "loopback_read_whole/loopback_layer",
        &s.read_whole_16k,
        &s.layered_16k,
        "",
    );
    print_ratio(
        "loopback_read_whole_1m/loopback_layer_1m",
        &s.read_whole_1m,
        &s.layered_1m,
        "",
    );
    if !s.ours.is_empty() {
        print_ratio("reqwest_mw_layer/reqwest_retry", &s.ours, &s.reference, "");
    } else {
        println!("(reqwest rows need --features reqwest-middleware)");
    }
    for (name, samples) in [
        ("loopback_bare", &mut s.bare),
        ("loopback_layer", &mut s.layered),
        ("loopback_tower_retry", &mut s.tower_retry),
        ("loopback_layer_16k", &mut s.layered_16k),
        ("loopback_read_whole", &mut s.read_whole_16k),
        ("loopback_layer_1m", &mut s.layered_1m),
        ("loopback_read_whole_1m", &mut s.read_whole_1m),
        ("reqwest_mw_layer", &mut s.ours),
        ("reqwest_retry", &mut s.reference),
    ] {
        if !samples.is_empty() {
            println!("{name:<24} median {:>9.0} ns/request", median(samples));
        }
    }
}
