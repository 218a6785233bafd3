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
//!   `BEGIN`, the `INSERT`, the record's write with `COMMIT`: three round trips);
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
use tower_idempotency_keys::{IdempotencyLayer, MemoryStore};

mod common;
use common::{median, print_ratio};

#[path = "server_counts/proxy.rs"]
mod proxy;

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

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let bare = serve(|req| async { Ok(handler(req).await) }).await;
    let memory = layered(MemoryStore::with_limits(1 << 20, 1 << 30)).await;
    let redis = redis_variants().await;
    let pair = redis_pair().await;
    let pg = pg::variants().await;

    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    if let Ok(only) = std::env::var("SERVER_ONLY") {
        let (variant, n) = only.split_once(':').expect("SERVER_ONLY=<variant>:<n>");
        let n: u64 = n.parse().expect("a request count");
        let url = match variant {
            "bare" => &bare,
            "memory" => &memory,
            "floor" => &redis.0,
            "redis" => &redis.1,
            "redis_pair" => &pair.as_ref().expect("redis-server for the pair").wait0,
            "redis_wait1" => &pair.as_ref().expect("redis-server for the pair").wait1,
            "pg_floor" => &pg.floor,
            "pg" => &pg.layered,
            "pg_floor_async" => &pg.floor_async,
            "pg_async" => &pg.layered_async,
            other => panic!("unknown variant {other}"),
        };
        for _ in 0..20 + n {
            keyed_post(&client, url).await;
        }
        pg.drop_schema().await;
        redis.clean();
        return;
    }
    for _ in 0..500 {
        keyed_post(&client, &bare).await;
        keyed_post(&client, &memory).await;
        {
            keyed_post(&client, &redis.0).await;
            keyed_post(&client, &redis.1).await;
            if let Some(pair) = &pair {
                keyed_post(&client, &pair.wait0).await;
                keyed_post(&client, &pair.wait1).await;
            }
        }
        {
            keyed_post(&client, &pg.floor).await;
            keyed_post(&client, &pg.layered).await;
            keyed_post(&client, &pg.floor_async).await;
            keyed_post(&client, &pg.layered_async).await;
        }
    }
    let (mut a, mut b, mut c, mut d) = (vec![], vec![], vec![], vec![]);
    let (mut e, mut f): (Vec<f64>, Vec<f64>) = (vec![], vec![]);
    let (mut g, mut h): (Vec<f64>, Vec<f64>) = (vec![], vec![]);
    let (mut i, mut j): (Vec<f64>, Vec<f64>) = (vec![], vec![]);
    // Up to 301 rounds (60 s at most): on a shared machine the medians of 61 batches moved by
    // several percent from run to run.
    let deadline = Instant::now() + Duration::from_secs(60);
    for round in 0..301 {
        // Of each pair, whichever runs second can gain from the first's warm caches: the
        // order alternates from round to round.
        let (first, second) = if round % 2 == 0 { (0, 1) } else { (1, 0) };
        for side in [first, second] {
            if side == 0 {
                batch!(a, 100, keyed_post(&client, &bare).await);
            } else {
                batch!(b, 100, keyed_post(&client, &memory).await);
            }
        }
        for side in [first, second] {
            if side == 0 {
                batch!(c, 100, keyed_post(&client, &redis.0).await);
            } else {
                batch!(d, 100, keyed_post(&client, &redis.1).await);
            }
        }
        if let Some(pair) = &pair {
            for side in [first, second] {
                if side == 0 {
                    batch!(g, 100, keyed_post(&client, &pair.wait0).await);
                } else {
                    batch!(h, 100, keyed_post(&client, &pair.wait1).await);
                }
            }
        }
        for side in [first, second] {
            if side == 0 {
                batch!(e, 100, keyed_post(&client, &pg.floor).await);
            } else {
                batch!(f, 100, keyed_post(&client, &pg.layered).await);
            }
        }
        for side in [first, second] {
            if side == 0 {
                batch!(i, 100, keyed_post(&client, &pg.floor_async).await);
            } else {
                batch!(j, 100, keyed_post(&client, &pg.layered_async).await);
            }
        }
        if Instant::now() > deadline {
            break;
        }
    }
    // Each round's ratios, before the medians sort the samples.
    print_ratio("idem_memory/bare_server", &b, &a, "");
    if c.is_empty() {
        println!("(the Redis rows need --features redis)");
    } else {
        print_ratio("idem_redis/redis_floor", &d, &c, "");
    }
    if !g.is_empty() {
        print_ratio(
            "idem_redis_wait1/idem_redis",
            &h,
            &g,
            " (both on the bench's own primary with one replica)",
        );
    }
    if e.is_empty() {
        println!("(the PostgreSQL rows need --features postgres)");
    } else {
        print_ratio("idem_pg/pg_floor", &f, &e, "");
        print_ratio(
            "idem_pg_async/pg_floor_async",
            &j,
            &i,
            " (synchronous_commit off: no wait for the WAL flush)",
        );
    }
    if let Some(pair) = &pair {
        print_redis_counts(&client, pair).await;
    }
    pg.print_counts(&client).await;
    for (name, samples) in [
        ("bare_server", &mut a),
        ("idem_memory", &mut b),
        ("redis_floor", &mut c),
        ("idem_redis", &mut d),
        ("idem_redis_pair", &mut g),
        ("idem_redis_wait1", &mut h),
        ("pg_floor", &mut e),
        ("idem_pg", &mut f),
        ("pg_floor_async", &mut i),
        ("idem_pg_async", &mut j),
    ] {
        if !samples.is_empty() {
            println!("{name:<16} median {:>9.0} ns/request", median(samples));
        }
    }
    pg.drop_schema().await;
    redis.clean();
}

/// The PostgreSQL floor and the layer in atomic mode, in a schema of the run's own.
mod pg {
    use std::convert::Infallible;
    use std::hint::black_box;
    use std::str::FromStr;
    use std::time::Duration;

    use bytes::Bytes;
    use http::{Request, Response};
    use http_body_util::{BodyExt, Either, Full};
    use hyper::body::Incoming;
    use hyper_util::client::legacy::{connect::HttpConnector, Client};
    use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
    use tower::ServiceExt;
    use tower_idempotency_keys::{IdempotencyLayer, KeyTransaction, PostgresStore};

    use super::proxy;

    const INSERT: &str = "INSERT INTO bench_orders (body) VALUES ($1)";

    pub(crate) struct Variants {
        pub(crate) floor: String,
        pub(crate) layered: String,
        /// The same two with `synchronous_commit = off` in their sessions: what is left
        /// without the wait for the WAL flush.
        pub(crate) floor_async: String,
        pub(crate) layered_async: String,
        url: String,
        schema: String,
    }

    fn options(url: &str, schema: &str) -> PgConnectOptions {
        PgConnectOptions::from_str(url)
            .expect("DATABASE_URL")
            .options([("search_path", schema)])
    }

    async fn pool(options: PgConnectOptions) -> PgPool {
        PgPoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .expect("PostgreSQL")
    }

    fn database_url() -> String {
        std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
    }

    pub(crate) async fn variants() -> Variants {
        let url = database_url();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let schema = format!("trs_bench_{}_{nanos}", std::process::id());
        let admin = pool(options(&url, "public")).await;
        sqlx::query(&format!("CREATE SCHEMA {schema}"))
            .execute(&admin)
            .await
            .expect("CREATE SCHEMA");
        admin.close().await;
        let pool = pool(options(&url, &schema)).await;
        sqlx::raw_sql("CREATE TABLE bench_orders (id bigserial PRIMARY KEY, body bytea NOT NULL)")
            .execute(&pool)
            .await
            .expect("CREATE TABLE");
        PostgresStore::from_pool(pool.clone())
            .migrate()
            .await
            .expect("migrate");
        let (floor, layered) = pair(pool).await;
        let no_flush = options(&url, &schema).options([("synchronous_commit", "off")]);
        let (floor_async, layered_async) = pair(self::pool(no_flush).await).await;
        Variants {
            floor,
            layered,
            floor_async,
            layered_async,
            url,
            schema,
        }
    }

    /// The floor and atomic mode over `pool`: their URLs.
    async fn pair(pool: PgPool) -> (String, String) {
        let store = PostgresStore::from_pool(pool.clone());
        let floor = super::serve(move |req: Request<Incoming>| {
            let pool = pool.clone();
            async move {
                let body = req.into_body().collect().await.expect("body").to_bytes();
                let mut tx = pool.begin().await.expect("BEGIN");
                sqlx::query(INSERT)
                    .bind(body.as_ref())
                    .execute(&mut *tx)
                    .await
                    .expect("INSERT");
                tx.commit().await.expect("COMMIT");
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(
                    b"{\"id\":\"msg_1\"}",
                ))))
            }
        })
        .await;

        let layer = IdempotencyLayer::new(store).atomic();
        let layered = super::serve(move |req: Request<Incoming>| {
            let svc = tower::Layer::layer(&layer, tower::service_fn(handler));
            svc.oneshot(req)
        })
        .await;
        (floor, layered)
    }

    /// The same `INSERT`, in the request's transaction.
    async fn handler(
        req: Request<Either<Full<Bytes>, Incoming>>,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        let tx = KeyTransaction::of(&req).cloned().expect("a keyed request");
        let body = req.into_body().collect().await.expect("body").to_bytes();
        let mut conn = tx.acquire().await.expect("the transaction");
        sqlx::query(INSERT)
            .bind(body.as_ref())
            .execute(&mut *conn)
            .await
            .expect("INSERT");
        black_box(&body);
        Ok(Response::new(Full::new(Bytes::from_static(
            b"{\"id\":\"msg_1\"}",
        ))))
    }

    impl Variants {
        /// Per request, for the floor and atomic mode: round trips to PostgreSQL (counted by a
        /// proxy between a pool of their own and the server; the pool's pings of the
        /// connection it hands out and gets back, two per request on both, are among them)
        /// and WAL bytes (the insert position before and after a batch: the server's, so
        /// others' writes add to it; the least of three batches).
        pub(crate) async fn print_counts(&self, client: &Client<HttpConnector, Full<Bytes>>) {
            const N: u64 = 200;
            let options = options(&self.url, &self.schema);
            let upstream = format!("{}:{}", options.get_host(), options.get_port());
            let (port, tally) = proxy::start(upstream).await;
            let (floor, layered) =
                pair(pool(options.clone().host("127.0.0.1").port(port)).await).await;
            let admin = pool(options).await;
            let lsn = || async {
                sqlx::query_scalar::<_, String>("SELECT pg_current_wal_insert_lsn()::text")
                    .fetch_one(&admin)
                    .await
                    .expect("WAL position")
            };
            let mut wal = [f64::MAX; 2];
            let mut trips = [(f64::MAX, 0.0); 2];
            for _ in 0..3 {
                for (i, url) in [&floor, &layered].into_iter().enumerate() {
                    for _ in 0..20 {
                        super::keyed_post(client, url).await;
                    }
                    // The last request's connection back in the pool (its ping answered).
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let (start, (rt0, pings0)) = (lsn().await, tally.read());
                    for _ in 0..N {
                        super::keyed_post(client, url).await;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let (rt1, pings1) = tally.read();
                    let bytes: f64 = sqlx::query_scalar(
                        "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::float8",
                    )
                    .bind(&start)
                    .fetch_one(&admin)
                    .await
                    .expect("WAL bytes");
                    wal[i] = wal[i].min(bytes / N as f64);
                    let per = (rt1 - rt0) as f64 / N as f64;
                    if per < trips[i].0 {
                        trips[i] = (per, (pings1 - pings0) as f64 / N as f64);
                    }
                }
            }
            admin.close().await;
            for (i, name) in ["pg_floor", "idem_pg"].into_iter().enumerate() {
                println!(
                    "count {name}.round_trips {:.3} (of which a Sync alone, a ping of the pool's: {:.3})",
                    trips[i].0, trips[i].1
                );
                println!("count {name}.wal_bytes {:.0}", wal[i]);
            }
            println!("count idem_pg/pg_floor.wal_bytes {:.3}", wal[1] / wal[0]);
        }

        pub(crate) async fn drop_schema(&self) {
            let admin = pool(options(&self.url, "public")).await;
            sqlx::query(&format!("DROP SCHEMA {} CASCADE", self.schema))
                .execute(&admin)
                .await
                .expect("DROP SCHEMA");
            admin.close().await;
        }
    }
}

/// The Redis floor and the layer over `RedisStore` (their URLs), under a fresh key prefix,
/// which `clean` deletes.
struct RedisVariants(String, String, String);

impl RedisVariants {
    /// Deletes the run's keys: the bench leaves nothing behind.
    fn clean(&self) {
        let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
        let client = redis::Client::open(url.as_str()).expect("redis url");
        let mut con = client.get_connection().expect("redis");
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", self.2))
            .query(&mut con)
            .expect("KEYS");
        for chunk in keys.chunks(1000) {
            let () = redis::cmd("DEL").arg(chunk).query(&mut con).expect("DEL");
        }
    }
}

async fn redis_variants() -> RedisVariants {
    use tower_idempotency_keys::RedisStore;
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let prefix = format!("trs-bench-{nanos}:");
    let floor = redis_floor(&url, format!("{prefix}floor:")).await;
    let store = RedisStore::connect(&url)
        .await
        .expect("redis")
        .prefix(format!("{prefix}layer:"));
    RedisVariants(floor, layered(store).await, prefix)
}

/// The Redis floor on the Redis at `url`, its keys under `prefix`: its URL.
async fn redis_floor(url: &str, prefix: String) -> String {
    let client = redis::Client::open(url).expect("redis url");
    let manager = redis::aio::ConnectionManager::new(client)
        .await
        .expect("redis");
    serve(move |req: Request<Incoming>| {
        let (mut con, prefix) = (manager.clone(), prefix.clone());
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
    .await
}

/// Redis's own count of the commands a keyed request sends, floor and layer (`INFO
/// commandstats` before and after a batch, on the bench's own primary where nothing else runs:
/// the layer there is `idem_redis_pair`'s, the same store as `idem_redis`). A command that a
/// script runs is counted as well as the script's own call.
async fn print_redis_counts(client: &Client<HttpConnector, Full<Bytes>>, pair: &Pair) {
    use std::collections::BTreeMap;
    const N: u64 = 200;
    let url = format!("redis://127.0.0.1:{}", pair.ports[0]);
    let floor = redis_floor(&url, "bench-floor:".into()).await;
    let mut con = redis::Client::open(url.as_str())
        .and_then(|c| c.get_connection())
        .expect("the pair's primary");
    let mut stats = || -> BTreeMap<String, u64> {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut con)
            .expect("INFO");
        info.lines()
            .filter_map(|line| {
                let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = rest.strip_prefix("calls=")?.split(',').next()?;
                Some((name.to_owned(), calls.parse().ok()?))
            })
            .collect()
    };
    for (name, url) in [("redis_floor", &floor), ("idem_redis", &pair.wait0)] {
        for _ in 0..20 {
            keyed_post(client, url).await;
        }
        let before = stats();
        for _ in 0..N {
            keyed_post(client, url).await;
        }
        let after = stats();
        let mut total = 0.0;
        for (command, calls) in &after {
            // The bench's own INFO, and the replica's acknowledgements.
            if command == "info" || command == "replconf" {
                continue;
            }
            let per = (calls - before.get(command).copied().unwrap_or(0)) as f64 / N as f64;
            if per > 0.0 {
                println!("count {name}.calls.{command} {per:.3}");
                total += per;
            }
        }
        println!("count {name}.calls {total:.3} (commands Redis ran per request)");
    }
}

/// A primary with one replica, of the bench's own, and the layer over `RedisStore` on it not
/// waiting (`wait0`) and waiting for the replica (`wait1`). The processes are killed when it is
/// dropped (their keys go with them). `None`, with a line saying why, without `redis-server`.
struct Pair {
    children: Vec<std::process::Child>,
    ports: [u16; 2],
    wait0: String,
    wait1: String,
}

impl Drop for Pair {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        // A replica keeps the snapshot of its full sync.
        for port in &self.ports {
            let _ =
                std::fs::remove_file(std::env::temp_dir().join(format!("trs-bench-{port}.rdb")));
        }
    }
}

async fn redis_pair() -> Option<Pair> {
    use std::process::{Command, Stdio};
    use tower_idempotency_keys::RedisStore;
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port")
    };
    let spawn = |port: u16, more: &[String]| {
        Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(std::env::temp_dir())
            .args(["--dbfilename", &format!("trs-bench-{port}.rdb")])
            .args(more)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
    };
    let (primary, replica) = (free(), free());
    let mut pair = Pair {
        children: Vec::new(),
        ports: [primary, replica],
        wait0: String::new(),
        wait1: String::new(),
    };
    match spawn(primary, &[]) {
        Ok(child) => pair.children.push(child),
        Err(e) => {
            println!("(the idem_redis_wait1 rows need redis-server on PATH: {e})");
            return None;
        }
    }
    let replica_of = [
        "--replicaof".to_owned(),
        "127.0.0.1".to_owned(),
        primary.to_string(),
    ];
    pair.children
        .push(spawn(replica, &replica_of).expect("redis-server"));
    // Until a marker written on the primary is read on the replica: the stream flows.
    let url = format!("redis://127.0.0.1:{primary}");
    let replica_url = format!("redis://127.0.0.1:{replica}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let flows = (|| -> redis::RedisResult<bool> {
            let mut p = redis::Client::open(url.as_str())?.get_connection()?;
            let mut r = redis::Client::open(replica_url.as_str())?.get_connection()?;
            let () = redis::cmd("SET")
                .arg("trs-bench-marker")
                .arg(primary)
                .query(&mut p)?;
            let seen: Option<u16> = redis::cmd("GET").arg("trs-bench-marker").query(&mut r)?;
            Ok(seen == Some(primary))
        })();
        if flows.unwrap_or(false) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the bench's replica never synced"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let store = |replicas| {
        // A generous replica timeout: the bench measures the cost of waiting, and a loaded
        // machine must not turn a slow acknowledgement into a 503.
        RedisStore::builder(&url)
            .wait_for_replicas(replicas)
            .replica_timeout(Duration::from_secs(5))
            .prefix("bench:")
            .connect()
    };
    pair.wait0 = layered(store(0).await.expect("the pair's primary")).await;
    pair.wait1 = layered(store(1).await.expect("the pair's primary")).await;
    Some(pair)
}
