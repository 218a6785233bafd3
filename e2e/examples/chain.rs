//! Exactly once at every hop: client → server (atomic mode) → provider, three servers in one
//! process on loopback sockets, each hop losing its first response after the work was done.
//!
//! - The **client** sends `POST /orders` through this crate's retry layer, which mints one
//!   `Idempotency-Key` for the request and sends it on every attempt.
//! - The **server** runs `IdempotencyLayer::new(PostgresStore).atomic()`: its handler writes
//!   the order in the request's transaction ([`KeyTransaction`]) and charges the provider with
//!   the key derived from the request's ([`RequestKey::derive`]), through the same retry
//!   layer. The key's entry commits with the order, once.
//! - The **provider** honours keys (`IdempotencyLayer` over a `MemoryStore`).
//!
//! Faults: the provider's first answer is lost after it charged (the server's client repeats
//! the derived key: the provider sends its stored response), and the server's first answer is lost after it
//! committed (the client repeats its key: the server sends its stored response). A server that crashed instead
//! would have rolled the order back, and its re-run would send the provider the same derived
//! key: `server/tests/postgres/crash.rs` kills a real process at each point.
//!
//! Run: `cargo run --example chain` (PostgreSQL at `DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/postgres`; the example works in a schema of its own and
//! drops it).

use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use retry_safety_e2e::loopback::serve;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use tower::util::BoxCloneService;
use tower::{service_fn, BoxError, Service, ServiceBuilder, ServiceExt};
use tower_idempotency_keys::{
    stores::MemoryStore, stores::PostgresStore, IdempotencyLayer, KeyTransaction, RequestKey,
};
use tower_retry_safety::{RetryPolicy, RetrySafety};

type Outbound = RetrySafety<Client<HttpConnector, Full<Bytes>>>;
type Req = Request<Either<Full<Bytes>, Incoming>>;

/// The crate's client layer: keys minted per request, trusted on loopback.
fn outbound() -> Result<Outbound, BoxError> {
    let policy = RetryPolicy::builder()
        .mint_idempotency_keys(true)
        .honor_idempotency_key_for_host("127.0.0.1")
        .max_retries(3)
        .backoff(Duration::from_millis(10), Duration::from_millis(50))
        .no_budget()
        .build()?;
    Ok(ServiceBuilder::new()
        .layer(policy)
        .service(Client::builder(TokioExecutor::new()).build_http()))
}

/// In front of a server: the first response is lost after the server did its work (the
/// connection closes without it).
fn lose_first_response<S, B>(svc: S) -> BoxCloneService<Request<Incoming>, Response<B>, BoxError>
where
    S: Service<Request<Incoming>, Response = Response<B>, Error = BoxError>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: 'static,
{
    let lost = Arc::new(AtomicBool::new(false));
    BoxCloneService::new(service_fn(move |req| {
        let (svc, lost) = (svc.clone(), lost.clone());
        async move {
            let res = svc.oneshot(req).await?;
            if !lost.swap(true, Ordering::SeqCst) {
                return Err("response lost (fault injected)".into());
            }
            Ok(res)
        }
    }))
}

/// The provider: charges once per key.
async fn provider(charges: Arc<AtomicU32>) -> Result<SocketAddr, BoxError> {
    let svc = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(MemoryStore::new()))
        .service(service_fn(move |_req: Req| {
            let n = charges.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                Ok::<_, BoxError>(Response::new(Full::new(Bytes::from(format!(
                    "charge #{n}"
                )))))
            }
        }));
    serve(lose_first_response(svc)).await
}

/// The server's handler: the order in the request's transaction, the charge with the derived
/// key.
async fn create_order(
    outbound: Outbound,
    provider: SocketAddr,
    req: Req,
) -> Result<Response<Full<Bytes>>, BoxError> {
    let key = req
        .extensions()
        .get::<RequestKey>()
        .cloned()
        .ok_or("no key")?;
    let tx = KeyTransaction::of(&req).cloned().ok_or("no transaction")?;
    let mut conn = tx.acquire().await?;
    let id: i64 = sqlx::query_scalar("INSERT INTO orders (note) VALUES ('book') RETURNING id")
        .fetch_one(&mut *conn)
        .await?;
    let charge = Request::post(format!("http://{provider}/charges"))
        .header("idempotency-key", key.derive("charge").header_value())
        .body(Full::new(Bytes::from_static(b"{\"amount\":5}")))?;
    let charged = outbound.oneshot(charge).await?;
    let receipt = charged.into_body().collect().await?.to_bytes();
    drop(conn);
    let mut res = Response::new(Full::new(Bytes::from(format!(
        "order {id}, {}",
        String::from_utf8_lossy(&receipt)
    ))));
    *res.status_mut() = StatusCode::CREATED;
    Ok(res)
}

async fn pool(url: &str, schema: &str) -> Result<PgPool, BoxError> {
    let options = PgConnectOptions::from_str(url)?.options([("search_path", schema)]);
    Ok(PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await?)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let schema = format!("trs_chain_{}", std::process::id());
    let admin = pool(&url, "public").await?;
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&admin)
        .await?;
    let outcome = run(&url, &schema).await;
    sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&admin)
        .await?;
    outcome
}

async fn run(url: &str, schema: &str) -> Result<(), BoxError> {
    let db = pool(url, schema).await?;
    sqlx::raw_sql("CREATE TABLE orders (id bigserial PRIMARY KEY, note text NOT NULL)")
        .execute(&db)
        .await?;
    let store = PostgresStore::from_pool(db.clone());
    store.migrate().await?;

    let charges = Arc::new(AtomicU32::new(0));
    let provider = provider(charges.clone()).await?;
    let calls = outbound()?;
    let server = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store).atomic())
        .service(service_fn(move |req: Req| {
            create_order(calls.clone(), provider, req)
        }));
    let server = serve(lose_first_response(server)).await?;

    let res = outbound()?
        .oneshot(
            Request::post(format!("http://{server}/orders"))
                .body(Full::new(Bytes::from_static(b"{\"item\":\"book\"}")))?,
        )
        .await?;
    let status = res.status();
    let stored = res.headers().contains_key("idempotent-replayed");
    let body = res.into_body().collect().await?.to_bytes();
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&db)
        .await?;
    println!(
        "client got {status} (stored: {stored}): {}",
        String::from_utf8_lossy(&body)
    );
    println!("orders written: {orders}");
    println!(
        "charges applied by the provider: {}",
        charges.load(Ordering::SeqCst)
    );
    db.close().await;
    if status != StatusCode::CREATED || orders != 1 || charges.load(Ordering::SeqCst) != 1 {
        return Err("a hop applied its write other than once".into());
    }
    Ok(())
}
