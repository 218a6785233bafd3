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
//! - a malformed key gets **400** and never reaches the store. Keys are what common clients
//!   send: a Structured Field string (`"8e03978e-…"`, the IETF draft's form) or a bare token of
//!   visible ASCII without quotes or backslashes (`8e03978e-…`, Stripe's form); non-empty, at
//!   most 255 bytes. Both spell the same key: `"k-1"` and `k-1` are one key.
//!
//! # A key is freed only if its handler did not run
//!
//! A key is claimed before the handler is called; a request refused before that (a malformed
//! key, a body over [the limit](IdempotencyLayer::max_request_bytes) or unreadable, a store
//! that failed: **503**, nothing run) claims nothing. Once the handler has been called, the key
//! is never freed, whatever happens:
//!
//! - **The client goes away** (its timeout, a disconnect; hyper then drops the request): the
//!   handler runs on in a task of its own until it answers, and its response is stored for
//!   the replay. Repeats meanwhile get 409.
//! - **The handler fails** (the inner service returns an error — a server-side timeout, a
//!   lost backend — or panics): it may have applied its effect before failing, so the outcome
//!   is *unknown*, and a stand-in record says so: **500**, `x-should-retry: false` and a text
//!   body. Every repeat gets it; the error itself reaches hyper as before. (Keeping the key in
//!   flight instead would answer 409 until the TTL ends, a day by default.)
//! - **The response cannot be stored whole** (over
//!   [`max_response_bytes`](IdempotencyLayer::max_response_bytes), with trailers, or its body
//!   fails while being read): the first client gets the whole response, streamed; repeats get
//!   its status and headers with an empty body and `idempotent-replay-body: omitted`.
//! - **The store refuses the record** (full, failing): the key stays in flight until its TTL.
//!
//! The call runs on the current tokio runtime (`tokio::spawn`), so the inner service and its
//! future must be `Send + 'static`. Outside a tokio runtime it runs in the request's own future.
//!
//! # What is stored
//!
//! Responses of every status are stored, errors included: a 500 may come after the write was
//! partly applied, and a client that repeats the key must learn the same outcome rather than
//! run the write a second time. Requests without a key pass through untouched, unless their
//! method [requires one](IdempotencyLayer::require_key_for).
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
mod outcome;
#[cfg(feature = "redis")]
mod record;
#[cfg(feature = "redis")]
mod redis;
mod run;
mod service;
mod store;

pub use body::ResponseBody;
pub use layer::IdempotencyLayer;
pub use memory::MemoryStore;
#[cfg(feature = "redis")]
pub use redis::RedisStore;
pub use service::IdempotencyService;
pub use store::{Begin, Claim, Entry, Fingerprint, IdempotencyStore, StoreError, StoredResponse};
