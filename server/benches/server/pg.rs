//! The PostgreSQL floor and the layer in atomic mode, in a schema of the run's own.

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
use tower_idempotency_keys::{stores::PostgresStore, IdempotencyLayer, KeyTransaction};

use super::round_trips;

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
        let (port, tally) = round_trips::start(upstream).await;
        let (floor, layered) = pair(pool(options.clone().host("127.0.0.1").port(port)).await).await;
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
