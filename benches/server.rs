//! The server layer's cost: keyed POSTs (a fresh key each) over loopback keep-alive to a hyper
//! server whose handler reads the body and answers. Side by side in one run, interleaved
//! batches, medians:
//!
//! - `bare_server`: the handler alone;
//! - `idem_memory`: the handler behind `IdempotencyLayer` over `MemoryStore`;
//! - with `--features redis` (Redis at `REDIS_URL`, default `redis://127.0.0.1:6379`):
//!   `redis_floor`, the handler doing itself the two round trips any idempotency layer over
//!   Redis needs (a `SET NX` to claim the key, a `SET` to store the response), and
//!   `idem_redis`, the handler behind `IdempotencyLayer` over `RedisStore`.
//!
//! Run: `cargo bench --bench server --features redis`
//!
//! Instructions per request, free of timing noise: `SERVER_ONLY=<variant>:<n>` (`bare`,
//! `memory`, `floor`, `redis`) sends 20 warm-up requests then `n` through one variant and
//! nothing else, so under `valgrind --tool=callgrind` the difference between `n` and `0`
//! divided by `n` is the count (`scripts/server-instructions.sh`).

use std::convert::Infallible;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::ServiceExt;
use tower_retry_safety::server::{IdempotencyLayer, MemoryStore};

mod common;
use common::median;

/// Serves `handle` on a fresh loopback port; returns its base URL.
async fn serve<F, Fut, B>(handle: F) -> String
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<tower::BoxError>,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let handle = handle.clone();
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), hyper::service::service_fn(handle))
                    .await;
            });
        }
    });
    format!("http://{addr}/v1/messages")
}

/// The handler every variant runs: read the body, answer.
async fn handler<B: http_body::Body>(req: Request<B>) -> Response<Full<Bytes>> {
    let body = req.into_body().collect().await.map(|b| b.to_bytes());
    black_box(body.ok());
    Response::new(Full::new(Bytes::from_static(b"{\"id\":\"msg_1\"}")))
}

/// A server with the layer over `store` in front of the handler.
async fn layered<St: tower_retry_safety::server::IdempotencyStore>(store: St) -> String {
    let layer = IdempotencyLayer::new(store);
    serve(move |req: Request<Incoming>| {
        let svc = tower::Layer::layer(
            &layer,
            tower::service_fn(|req| async { Ok::<_, Infallible>(handler(req).await) }),
        );
        svc.oneshot(req)
    })
    .await
}

static KEYS: AtomicU64 = AtomicU64::new(0);

async fn keyed_post(client: &Client<HttpConnector, Full<Bytes>>, url: &str) {
    let key = KEYS.fetch_add(1, Ordering::Relaxed);
    let req = Request::post(url)
        .header("idempotency-key", format!("\"bench-{key}\""))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            b"{\"to\":\"a@example.com\",\"text\":\"hi\"}",
        )))
        .expect("request");
    let res = client.request(req).await.expect("response");
    assert!(res.status().is_success(), "{}", res.status());
    black_box(res.into_body().collect().await.expect("body"));
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let bare = serve(|req| async { Ok(handler(req).await) }).await;
    let memory = layered(MemoryStore::with_limits(1 << 20, 1 << 30)).await;
    #[cfg(feature = "redis")]
    let redis = redis_variants().await;

    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    if let Ok(only) = std::env::var("SERVER_ONLY") {
        let (variant, n) = only.split_once(':').expect("SERVER_ONLY=<variant>:<n>");
        let n: u64 = n.parse().expect("a request count");
        let url = match variant {
            "bare" => &bare,
            "memory" => &memory,
            #[cfg(feature = "redis")]
            "floor" => &redis.0,
            #[cfg(feature = "redis")]
            "redis" => &redis.1,
            other => panic!("unknown variant {other}"),
        };
        for _ in 0..20 + n {
            keyed_post(&client, url).await;
        }
        return;
    }
    for _ in 0..500 {
        keyed_post(&client, &bare).await;
        keyed_post(&client, &memory).await;
        #[cfg(feature = "redis")]
        {
            keyed_post(&client, &redis.0).await;
            keyed_post(&client, &redis.1).await;
        }
    }
    let (mut a, mut b, mut c, mut d) = (vec![], vec![], vec![], vec![]);
    // Up to 301 rounds (60 s at most): on a shared machine the medians of 61 batches moved by
    // several percent from run to run.
    let deadline = Instant::now() + Duration::from_secs(60);
    for _ in 0..301 {
        batch!(a, 100, keyed_post(&client, &bare).await);
        batch!(b, 100, keyed_post(&client, &memory).await);
        #[cfg(feature = "redis")]
        {
            batch!(c, 100, keyed_post(&client, &redis.0).await);
            batch!(d, 100, keyed_post(&client, &redis.1).await);
        }
        if Instant::now() > deadline {
            break;
        }
    }
    let (bare_ns, memory_ns) = (median(&mut a), median(&mut b));
    println!("bare_server median {bare_ns:>9.0} ns/request");
    println!("idem_memory median {memory_ns:>9.0} ns/request");
    println!("ratio idem_memory/bare_server {:.3}", memory_ns / bare_ns);
    if c.is_empty() {
        println!("(the Redis rows need --features redis)");
    } else {
        let (floor_ns, redis_ns) = (median(&mut c), median(&mut d));
        println!("redis_floor median {floor_ns:>9.0} ns/request");
        println!("idem_redis  median {redis_ns:>9.0} ns/request");
        println!("ratio idem_redis/redis_floor {:.3}", redis_ns / floor_ns);
    }
}

/// The Redis floor and the layer over `RedisStore`, under a fresh key prefix.
#[cfg(feature = "redis")]
async fn redis_variants() -> (String, String) {
    use tower_retry_safety::server::RedisStore;
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let prefix = format!("trs-bench-{nanos}:");
    let client = redis::Client::open(url.as_str()).expect("redis url");
    let manager = redis::aio::ConnectionManager::new(client)
        .await
        .expect("redis");
    let floor_prefix = format!("{prefix}floor:");
    let floor = serve(move |req: Request<Incoming>| {
        let (mut con, prefix) = (manager.clone(), floor_prefix.clone());
        async move {
            let key = format!(
                "{prefix}{}",
                req.headers()
                    .get("idempotency-key")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
            );
            let claimed: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg("in-flight")
                .arg("NX")
                .arg("PX")
                .arg(60_000)
                .query_async(&mut con)
                .await
                .expect("SET NX");
            black_box(claimed);
            let res = handler(req).await;
            let () = redis::cmd("SET")
                .arg(&key)
                .arg("{\"id\":\"msg_1\"}")
                .arg("PX")
                .arg(86_400_000)
                .query_async(&mut con)
                .await
                .expect("SET");
            Ok(res)
        }
    })
    .await;
    let store = RedisStore::connect(&url)
        .await
        .expect("redis")
        .prefix(format!("{prefix}layer:"));
    (floor, layered(store).await)
}
