//! Real PostgreSQL for the tests: a schema of each test's own on the server at `DATABASE_URL`
//! (default `postgres://postgres@127.0.0.1:5432/postgres`), dropped when the test ends (also
//! when it fails), and a loopback hyper server for a tower service.
#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use tokio::net::TcpListener;
use tower::{BoxError, Service, ServiceExt};

pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// A name fresh for each call, across processes.
pub fn fresh(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{prefix}_{}_{nanos}", std::process::id())
}

/// A pool whose connections work in `schema` (first in their `search_path`).
pub async fn pool_in(url: &str, schema: &str, max: u32) -> PgPool {
    let options = PgConnectOptions::from_str(url)
        .expect("DATABASE_URL")
        .options([("search_path", schema)]);
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(2))
        .connect_with(options)
        .await
        .expect("PostgreSQL on 127.0.0.1:5432 (start it: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start)")
}

/// A schema of the test's own, with the crate's table and an `orders` table for handlers.
pub struct TestDb {
    pub url: String,
    pub schema: String,
}

impl TestDb {
    pub async fn new() -> TestDb {
        let url = database_url();
        let schema = fresh("trs_test");
        let admin = pool_in(&url, "public", 1).await;
        sqlx::query(&format!("CREATE SCHEMA {schema}"))
            .execute(&admin)
            .await
            .unwrap();
        admin.close().await;
        let db = TestDb { url, schema };
        let pool = db.pool(2).await;
        sqlx::raw_sql(
            "CREATE TABLE orders (id bigserial PRIMARY KEY, key text NOT NULL, note text NOT NULL)",
        )
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
        db
    }

    pub async fn pool(&self, max: u32) -> PgPool {
        pool_in(&self.url, &self.schema, max).await
    }

    pub async fn count(&self, sql: &str) -> i64 {
        let pool = self.pool(1).await;
        let n: i64 = sqlx::query_scalar(sql).fetch_one(&pool).await.unwrap();
        pool.close().await;
        n
    }
}

impl Drop for TestDb {
    /// Drops the schema on a thread of its own (this may run in a runtime, or while a failed
    /// test unwinds).
    fn drop(&mut self) {
        drop_schema(&self.url, &format!("DROP SCHEMA {} CASCADE", self.schema));
    }
}

/// A schema a test makes beside its own (a tenant's, a decoy), dropped with this guard: at the
/// test's end, passed or failed. Make it right after the schema.
pub struct ExtraSchema {
    url: String,
    schema: String,
}

impl ExtraSchema {
    pub fn guard(db: &TestDb, schema: &str) -> ExtraSchema {
        ExtraSchema {
            url: db.url.clone(),
            schema: schema.to_owned(),
        }
    }
}

impl Drop for ExtraSchema {
    /// Drops the schema unless the test did.
    fn drop(&mut self) {
        drop_schema(
            &self.url,
            &format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema),
        );
    }
}

/// Runs `sql` (a `DROP SCHEMA`) on a thread of its own: a drop may run in a runtime, or while a
/// failed test unwinds.
fn drop_schema(url: &str, sql: &str) {
    let (url, sql) = (url.to_owned(), sql.to_owned());
    let dropped = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let admin = pool_in(&url, "public", 1).await;
            sqlx::query(&sql).execute(&admin).await.unwrap();
            admin.close().await;
        });
    })
    .join();
    if dropped.is_err() && !std::thread::panicking() {
        panic!("could not drop the test's schema");
    }
}

/// Serves `svc` on 127.0.0.1 (a free port), one hyper h1 connection task each.
pub async fn serve<S, B>(svc: S) -> SocketAddr
where
    S: Service<Request<Incoming>, Response = Response<B>> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve_on(listener, svc));
    addr
}

/// Serves `svc` on `listener` until the runtime ends.
pub async fn serve_on<S, B>(listener: TcpListener, svc: S)
where
    S: Service<Request<Incoming>, Response = Response<B>> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let svc = svc.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| svc.clone().oneshot(req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    }
}

pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A POST with a key; the response's status, replay header and body, or the transport error.
pub async fn post(
    client: &Client<HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
    path: &str,
    key: &str,
    body: &str,
) -> Result<(u16, bool, String), BoxError> {
    let req = Request::post(format!("http://{addr}{path}"))
        .header("idempotency-key", format!("\"{key}\""))
        .body(Full::new(Bytes::from(body.to_owned())))?;
    let res = client.request(req).await?;
    let status = res.status().as_u16();
    let replayed = res.headers().contains_key("idempotent-replayed");
    let body = res.into_body().collect().await?.to_bytes();
    Ok((
        status,
        replayed,
        String::from_utf8_lossy(&body).into_owned(),
    ))
}

pub type Never = Infallible;
