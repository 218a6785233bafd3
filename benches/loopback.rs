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
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{Service, ServiceExt};
use tower_retry_safety::RetryPolicy;

mod common;
use common::{median, print_ratio, CloneNeverRetry};

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

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let base = server().await;
    let url = format!("{base}/v1/things/1");
    let (url_16k, url_1m) = (
        format!("{base}/v1/files/16k"),
        format!("{base}/v1/files/1m"),
    );
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    // Each body-size row on a client (a connection pool) of its own: with one pool, whichever
    // row ran first after the body size changed paid 20-30 % (hyper adapts a connection's
    // read buffer to the bodies it reads).
    let own_client = || Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let layered_with = |client| {
        tower::Layer::layer(
            &RetryPolicy::builder().build().expect("default policy"),
            client,
        )
    };
    let read_whole_with = |client| {
        tower::ServiceBuilder::new()
            .layer(RetryPolicy::builder().build().expect("default policy"))
            .layer(tower_retry_safety::ReadWholeLayer::new())
            .service(client)
    };
    let (mut layered_16k, mut read_whole_16k) =
        (layered_with(own_client()), read_whole_with(own_client()));
    let (mut layered_1m, mut read_whole_1m) =
        (layered_with(own_client()), read_whole_with(own_client()));
    let mut bare = client.clone();
    let mut tower_retry = tower::retry::Retry::new(CloneNeverRetry, client.clone());
    let mut layered = tower::Layer::layer(
        &RetryPolicy::builder().build().expect("default policy"),
        client,
    );

    #[cfg(feature = "reqwest-middleware")]
    let (ours, reference) = {
        let ours = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
            .with(tower_retry_safety::RetrySafetyMiddleware::new(
                RetryPolicy::builder().build().expect("default policy"),
            ))
            .build();
        let policy =
            reqwest_retry::policies::ExponentialBackoff::builder().build_with_max_retries(2);
        let reference = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
            .with(reqwest_retry::RetryTransientMiddleware::new_with_policy(
                policy,
            ))
            .build();
        (ours, reference)
    };
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

    if let Ok(only) = std::env::var("LOOPBACK_ONLY") {
        let (row, n) = only.split_once(':').expect("LOOPBACK_ONLY=<row>:<n>");
        let n: usize = n.parse().expect("a request count");
        for _ in 0..20 + n {
            match row {
                "bare" => tower_one(&mut bare, &url).await,
                "layer" => tower_one(&mut layered, &url).await,
                "tower_retry" => tower_one(&mut tower_retry, &url).await,
                "layer_16k" => tower_one(&mut layered_16k, &url_16k).await,
                "read_whole_16k" => tower_one(&mut read_whole_16k, &url_16k).await,
                "layer_1m" => tower_one(&mut layered_1m, &url_1m).await,
                "read_whole_1m" => tower_one(&mut read_whole_1m, &url_1m).await,
                #[cfg(feature = "reqwest-middleware")]
                "reqwest_mw_layer" => reqwest_one(&ours, &url).await,
                #[cfg(feature = "reqwest-middleware")]
                "reqwest_retry" => reqwest_one(&reference, &url).await,
                other => panic!("no row {other}"),
            }
        }
        return;
    }

    for _ in 0..2_000 {
        tower_one(&mut layered_16k, &url_16k).await;
        tower_one(&mut read_whole_16k, &url_16k).await;
        tower_one(&mut layered_1m, &url_1m).await;
        tower_one(&mut read_whole_1m, &url_1m).await;
        tower_one(&mut bare, &url).await;
        tower_one(&mut layered, &url).await;
        tower_one(&mut tower_retry, &url).await;
        #[cfg(feature = "reqwest-middleware")]
        {
            reqwest_one(&ours, &url).await;
            reqwest_one(&reference, &url).await;
        }
    }

    let (mut a, mut b, mut c, mut d, mut e) = (vec![], vec![], vec![], vec![], vec![]);
    let (mut f, mut g, mut h, mut i) = (vec![], vec![], vec![], vec![]);
    let deadline = Instant::now() + Duration::from_secs(90);
    for round in 0..101 {
        batch!(a, 200, tower_one(&mut bare, &url).await);
        batch!(b, 200, tower_one(&mut layered, &url).await);
        batch!(e, 200, tower_one(&mut tower_retry, &url).await);
        // Of each pair, whichever runs second was measured 10-45 % faster (1 MiB bodies): the
        // order alternates from round to round.
        if round % 2 == 0 {
            batch!(f, 100, tower_one(&mut layered_16k, &url_16k).await);
            batch!(g, 100, tower_one(&mut read_whole_16k, &url_16k).await);
            batch!(h, 10, tower_one(&mut layered_1m, &url_1m).await);
            batch!(i, 10, tower_one(&mut read_whole_1m, &url_1m).await);
        } else {
            batch!(g, 100, tower_one(&mut read_whole_16k, &url_16k).await);
            batch!(f, 100, tower_one(&mut layered_16k, &url_16k).await);
            batch!(i, 10, tower_one(&mut read_whole_1m, &url_1m).await);
            batch!(h, 10, tower_one(&mut layered_1m, &url_1m).await);
        }
        #[cfg(feature = "reqwest-middleware")]
        {
            batch!(c, 200, reqwest_one(&ours, &url).await);
            batch!(d, 200, reqwest_one(&reference, &url).await);
        }
        if Instant::now() > deadline {
            break;
        }
    }
    // Each round's ratios, before the medians sort the samples.
    print_ratio("loopback_layer/loopback_bare", &b, &a, "");
    print_ratio("loopback_tower_retry/loopback_bare", &e, &a, "");
    print_ratio("loopback_layer/loopback_tower_retry", &b, &e, "");
    print_ratio("loopback_read_whole/loopback_layer", &g, &f, "");
    print_ratio("loopback_read_whole_1m/loopback_layer_1m", &i, &h, "");
    if !c.is_empty() {
        print_ratio("reqwest_mw_layer/reqwest_retry", &c, &d, "");
    } else {
        println!("(reqwest rows need --features reqwest-middleware)");
    }
    for (name, samples) in [
        ("loopback_bare", &mut a),
        ("loopback_layer", &mut b),
        ("loopback_tower_retry", &mut e),
        ("loopback_layer_16k", &mut f),
        ("loopback_read_whole", &mut g),
        ("loopback_layer_1m", &mut h),
        ("loopback_read_whole_1m", &mut i),
        ("reqwest_mw_layer", &mut c),
        ("reqwest_retry", &mut d),
    ] {
        if !samples.is_empty() {
            println!("{name:<24} median {:>9.0} ns/request", median(samples));
        }
    }
}
