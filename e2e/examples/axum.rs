//! An axum server that honours idempotency keys, and a client that retries its writes safely.
//!
//! The whole `Router` is wrapped in the server layer (`IdempotencyLayer::for_axum`) and served
//! with `axum::serve` on 127.0.0.1. The client is hyper-util's, behind the retry layer, which
//! mints one key per write. The send handler is slower than the client's per-attempt timeout
//! on its first run: the client's first attempt times out after the write was applied, its
//! retries with the same key get 409 while the handler runs, then the stored response. The
//! write is applied once.
//!
//! ```sh
//! cargo run --example axum
//! ```

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::{extract::State, http::StatusCode, routing::post, Router};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};
use tower_retry_safety::{RetryPolicy, RetryReport};

/// The side effect: emails sent.
#[derive(Clone, Default)]
struct Outbox(Arc<AtomicU32>);

async fn send(State(outbox): State<Outbox>, body: String) -> (StatusCode, String) {
    let sent = outbox.0.fetch_add(1, Ordering::SeqCst) + 1;
    if sent == 1 {
        // Slower than the client's attempt timeout: its first attempt gives up after the
        // email went out.
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    (StatusCode::CREATED, format!("sent: {body}"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // --- the server: a whole Router behind one layer, served by axum::serve ---
    let outbox = Outbox::default();
    let router = Router::new()
        .route("/v1/messages", post(send))
        .with_state(outbox.clone());
    let app = IdempotencyLayer::new(MemoryStore::new())
        .for_axum()
        .layer(router);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server =
        tokio::spawn(async move { axum::serve(listener, tower::make::Shared::new(app)).await });

    // --- the client: one key per write, the same key on every retry ---
    let policy = RetryPolicy::builder()
        .mint_idempotency_keys(true)
        .attempt_timeout(Duration::from_millis(200))
        .max_retries(8)
        .backoff(Duration::from_millis(100), Duration::from_millis(400))
        .build()?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let svc = ServiceBuilder::new().layer(policy).service(client);

    let req = http::Request::post(format!("http://{addr}/v1/messages"))
        .body(Full::new(Bytes::from("hello")))?;
    let res = svc.oneshot(req).await?;
    let report = RetryReport::of(&res).cloned().ok_or("no report")?;
    let status = res.status();
    let stored = res.headers().contains_key("idempotent-replayed");
    let body = res.into_body().collect().await?.to_bytes();

    let sent = outbox.0.load(Ordering::SeqCst);
    println!(
        "{status} {:?} after {} attempts (stored: {stored}); the email was sent {sent} time(s)",
        String::from_utf8_lossy(&body),
        report.attempts(),
    );
    println!("report: {report}");
    server.abort();
    if sent != 1 || status != StatusCode::CREATED || !stored {
        return Err("expected one send and a stored 201".into());
    }
    Ok(())
}
