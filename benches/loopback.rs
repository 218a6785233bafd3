//! Cost per request over a real connection: a hyper server on 127.0.0.1, requests over
//! keep-alive. hyper-util's client bare, with `tower::retry` keeping a copy (the least any
//! retry layer does) and with this layer; with the `reqwest-middleware`
//! feature, reqwest with `RetrySafetyMiddleware` and with reqwest-retry's
//! `RetryTransientMiddleware`. Interleaved batches, medians, ratios.
//!
//! Run: `cargo bench --bench loopback --features reqwest-middleware`

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
use common::{median, CloneNeverRetry};

async fn server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = service_fn(|_req: Request<Incoming>| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    format!("http://{addr}/v1/things/1")
}

fn request(url: &str) -> Request<Full<Bytes>> {
    Request::get(url)
        .header("user-agent", "bench")
        .body(Full::new(Bytes::new()))
        .expect("valid request")
}

async fn tower_one<S, E>(svc: &mut S, url: &str)
where
    S: Service<Request<Full<Bytes>>, Response = Response<Incoming>, Error = E>,
    E: std::fmt::Debug,
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
    let url = server().await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
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

    for _ in 0..2_000 {
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
    let deadline = Instant::now() + Duration::from_secs(90);
    for _ in 0..101 {
        batch!(a, 200, tower_one(&mut bare, &url).await);
        batch!(b, 200, tower_one(&mut layered, &url).await);
        batch!(e, 200, tower_one(&mut tower_retry, &url).await);
        #[cfg(feature = "reqwest-middleware")]
        {
            batch!(c, 200, reqwest_one(&ours, &url).await);
            batch!(d, 200, reqwest_one(&reference, &url).await);
        }
        if Instant::now() > deadline {
            break;
        }
    }
    let (bare_ns, layer_ns) = (median(&mut a), median(&mut b));
    println!("loopback_bare  median {:>9.0} ns/request", bare_ns);
    println!("loopback_layer median {:>9.0} ns/request", layer_ns);
    let tower_ns = median(&mut e);
    println!("loopback_tower_retry median {:>9.0} ns/request", tower_ns);
    println!(
        "ratio loopback_layer/loopback_bare {:.3}",
        layer_ns / bare_ns
    );
    println!(
        "ratio loopback_tower_retry/loopback_bare {:.3}",
        tower_ns / bare_ns
    );
    println!(
        "ratio loopback_layer/loopback_tower_retry {:.3}",
        layer_ns / tower_ns
    );
    if !c.is_empty() {
        let (ours_ns, ref_ns) = (median(&mut c), median(&mut d));
        println!("reqwest_mw_layer median {:>9.0} ns/request", ours_ns);
        println!("reqwest_retry    median {:>9.0} ns/request", ref_ns);
        println!(
            "ratio reqwest_mw_layer/reqwest_retry {:.3}",
            ours_ns / ref_ns
        );
    } else {
        println!("(reqwest rows need --features reqwest-middleware)");
    }
}
