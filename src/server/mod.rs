//! Idempotency keys on the server: replay the stored result of a request repeated with the
//! same `Idempotency-Key`, so a client may retry a write safely.
//!
//! [`IdempotencyLayer`] is a tower layer for servers (hyper, axum). For a request with a key:
//!
//! - the first one runs; its response (any status) is buffered up to a limit, stored with a
//!   TTL and returned;
//! - a repeat while the first is in flight gets **409** with `Retry-After`;
//! - a repeat after it completed gets the stored response, byte for byte, with an
//!   `idempotent-replayed: true` header;
//! - the same key with a different request (method, path or body differ) gets **422**;
//! - a malformed key (not a Structured Field string, or longer than 255 bytes) gets **400** and
//!   never reaches the store;
//! - if the inner service fails (no response at all), nothing is stored and the key is freed.
//!
//! Responses of every status are stored, errors included: a 500 may come after the write was
//! partly applied, and a client that repeats the key must learn the same outcome rather than
//! run the write a second time. A response too large to store passes through, its key is
//! freed and a `warn` event says so. Requests without a key pass through untouched, unless
//! their method [requires one](IdempotencyLayer::require_key_for).
//!
//! ```
//! use std::convert::Infallible;
//! use bytes::Bytes;
//! use http_body_util::{Either, Full};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//! use tower_retry_safety::server::{IdempotencyLayer, MemoryStore};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let svc = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::new(MemoryStore::new()))
//!     .service(service_fn(|_req: http::Request<Either<Full<Bytes>, Full<Bytes>>>| async {
//!         Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from("sent"))))
//!     }));
//! let send = || {
//!     http::Request::post("/v1/messages")
//!         .header("idempotency-key", "\"k-1\"")
//!         .body(Full::new(Bytes::from("hi")))
//! };
//! let first = svc.clone().oneshot(send()?).await?;
//! let again = svc.oneshot(send()?).await?;
//! assert!(first.headers().get("idempotent-replayed").is_none());
//! assert_eq!(again.headers()["idempotent-replayed"], "true");
//! # Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
//! ```

mod body;
mod layer;
mod memory;
mod service;
mod store;

pub use body::ResponseBody;
pub use layer::IdempotencyLayer;
pub use memory::MemoryStore;
pub use service::IdempotencyService;
pub use store::{Begin, Entry, Fingerprint, IdempotencyStore, StoreError, StoredResponse};
