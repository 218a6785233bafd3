//! The server layer's cost: keyed POSTs (a fresh key each) over loopback keep-alive to a hyper
//! server whose handler reads the body and answers. Side by side in one run, interleaved
//! batches, medians:
//!
//! - `bare_server`: the handler alone;
//! - `idem_memory`: the handler behind `IdempotencyLayer` over `MemoryStore`;
//! - with `--features redis` (Redis at `REDIS_URL`, default `redis://127.0.0.1:6379`):
//!   `redis_floor`, the handler doing itself the two round trips any idempotency layer over
//!   Redis needs (a `SET NX` to claim the key, a `SET` to store the response), and
//!   `idem_redis`, the handler behind `IdempotencyLayer` over `RedisStore`; and, on a primary
//!   with one replica that the bench starts itself (`redis-server` on free loopback ports,
//!   killed at the end), `idem_redis_pair` (the store not waiting) and `idem_redis_wait1` (the
//!   store waiting for the replica: `wait_for_replicas(1)`). `ratio idem_redis_wait1/idem_redis`
//!   compares the last two: what waiting for one replica costs a keyed request.
//!
//! - with `--features postgres` (PostgreSQL at `DATABASE_URL`, default
//!   `postgres://postgres@127.0.0.1:5432/postgres`, in a schema of the run's own, dropped at
//!   the end): `pg_floor`, the handler doing the same `INSERT` in a transaction of its own
//!   (`BEGIN`, `INSERT`, `COMMIT`: three round trips), and `idem_pg`, the handler doing it in
//!   the request's transaction behind the layer in atomic mode (the key's lock and check with
//!   `BEGIN`, the `INSERT`, the entry's write with `COMMIT`: three round trips);
//!   `pg_floor_async` and `idem_pg_async`, the same two with `synchronous_commit = off` in
//!   their sessions (what is left without the wait for the WAL flush). Then, through a proxy
//!   that counts round trips, `count` lines: round trips and WAL bytes per request for both.
//!
//! Run: `cargo bench --bench server --features redis,postgres`
//!
//! Instructions per request, free of timing noise: `SERVER_ONLY=<variant>:<n>` (`bare`,
//! `memory`, `floor`, `redis`) sends 20 warm-up requests then `n` through one variant and
//! nothing else, so under `valgrind --tool=callgrind` the difference between `n` and `0`
//! divided by `n` is the count (`scripts/server-instructions.sh`); with `--features postgres`,
//! `pg_floor`, `pg`, `pg_floor_async` and `pg_async` too.

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
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};

mod pg;
mod redis_stores;
mod round_trips;

use redis_stores::{print_redis_counts, redis_pair, redis_variants, Pair, RedisVariants};
use retry_safety_testing::batch;
use retry_safety_testing::bench::{median, print_ratio};

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
async fn layered<St: tower_idempotency_keys::IdempotencyStore>(store: St) -> String {
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

/// Every variant's server, started once.
struct Servers {
    bare: String,
    memory: String,
    redis: RedisVariants,
    pair: Option<Pair>,
    pg: pg::Variants,
}

impl Servers {
    async fn start() -> Self {
        Servers {
            bare: serve(|req| async { Ok(handler(req).await) }).await,
            memory: layered(MemoryStore::with_limits(1 << 20, 1 << 30)).await,
            redis: redis_variants().await,
            pair: redis_pair().await,
            pg: pg::variants().await,
        }
    }

    /// The variants measured side by side, as (floor, variant) pairs of (name, URL), in the
    /// order they run in each round.
    fn pairs(&self) -> Vec<[(&'static str, &str); 2]> {
        let mut pairs = vec![
            [("bare_server", &*self.bare), ("idem_memory", &*self.memory)],
            [
                ("redis_floor", &*self.redis.0),
                ("idem_redis", &*self.redis.1),
            ],
        ];
        if let Some(pair) = &self.pair {
            pairs.push([
                ("idem_redis_pair", &*pair.wait0),
                ("idem_redis_wait1", &*pair.wait1),
            ]);
        }
        pairs.push([
            ("pg_floor", &*self.pg.floor),
            ("idem_pg", &*self.pg.layered),
        ]);
        pairs.push([
            ("pg_floor_async", &*self.pg.floor_async),
            ("idem_pg_async", &*self.pg.layered_async),
        ]);
        pairs
    }

    /// `SERVER_ONLY=<variant>:<n>`: 20 warm-up requests, then `n`, through one variant.
    async fn only(&self, client: &Client<HttpConnector, Full<Bytes>>, only: &str) {
        let (variant, n) = only.split_once(':').expect("SERVER_ONLY=<variant>:<n>");
        let n: u64 = n.parse().expect("a request count");
        let pair = || self.pair.as_ref().expect("redis-server for the pair");
        let url = match variant {
            "bare" => &self.bare,
            "memory" => &self.memory,
            "floor" => &self.redis.0,
            "redis" => &self.redis.1,
            "redis_pair" => &pair().wait0,
            "redis_wait1" => &pair().wait1,
            "pg_floor" => &self.pg.floor,
            "pg" => &self.pg.layered,
            "pg_floor_async" => &self.pg.floor_async,
            "pg_async" => &self.pg.layered_async,
            other => panic!("unknown variant {other}"),
        };
        for _ in 0..20 + n {
            keyed_post(client, url).await;
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let servers = Servers::start().await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    if let Ok(only) = std::env::var("SERVER_ONLY") {
        servers.only(&client, &only).await;
    } else {
        let pairs = servers.pairs();
        let samples = interleaved(&client, &pairs).await;
        report(&client, &servers, &pairs, samples).await;
    }
    servers.pg.drop_schema().await;
    servers.redis.clean();
}

/// Each pair's samples (ns per request, batches of 100), measured interleaved after a
/// warm-up.
async fn interleaved(
    client: &Client<HttpConnector, Full<Bytes>>,
    pairs: &[[(&'static str, &str); 2]],
) -> Vec<[Vec<f64>; 2]> {
    for _ in 0..500 {
        for (_, url) in pairs.iter().flatten() {
            keyed_post(client, url).await;
        }
    }
    let mut samples: Vec<[Vec<f64>; 2]> = pairs.iter().map(|_| [vec![], vec![]]).collect();
    // Up to 301 rounds (60 s at most): on a shared machine the medians of 61 batches moved by
    // several percent from run to run.
    let deadline = Instant::now() + Duration::from_secs(60);
    for round in 0..301 {
        // Of each pair, whichever runs second can gain from the first's warm caches: the
        // order alternates from round to round.
        let sides = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for (pair, samples) in pairs.iter().zip(&mut samples) {
            for side in sides {
                batch!(samples[side], 100, keyed_post(client, pair[side].1).await);
            }
        }
        if Instant::now() > deadline {
            break;
        }
    }
    samples
}

/// Each pair's ratio (from each round's samples, before the medians sort them), the round
/// trips counted through the proxy, then each variant's median.
async fn report(
    client: &Client<HttpConnector, Full<Bytes>>,
    servers: &Servers,
    pairs: &[[(&'static str, &str); 2]],
    mut samples: Vec<[Vec<f64>; 2]>,
) {
    for (pair, [floor, variant]) in pairs.iter().zip(&samples) {
        // The ratio's name as the bench has always printed it: the pair's second row over its
        // first, but the replica pair's, which compares with `idem_redis` by name.
        let (name, note) = match pair[1].0 {
            "idem_redis_wait1" => (
                "idem_redis_wait1/idem_redis".to_string(),
                " (both on the bench's own primary with one replica)",
            ),
            "idem_pg_async" => (
                format!("{}/{}", pair[1].0, pair[0].0),
                " (synchronous_commit off: no wait for the WAL flush)",
            ),
            _ => (format!("{}/{}", pair[1].0, pair[0].0), ""),
        };
        print_ratio(&name, variant, floor, note);
    }
    if let Some(pair) = &servers.pair {
        print_redis_counts(client, pair).await;
    }
    servers.pg.print_counts(client).await;
    for (pair, sides) in pairs.iter().zip(&mut samples) {
        for ((name, _), samples) in pair.iter().zip(sides) {
            println!("{name:<16} median {:>9.0} ns/request", median(samples));
        }
    }
}
