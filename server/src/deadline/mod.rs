//! Deadlines that cross hops, the server's half: [`DeadlineLayer`] reads the deadline each
//! request arrived with, caps it by the server's own maximum, answers at once a request
//! whose caller has already gone, and runs the rest inside the client crate's
//! [`deadline::scope`](tower_retry_safety::deadline::scope), so that a handler's nested
//! calls through a retry policy inherit it without glue.
//!
//! ```
//! use std::time::Duration;
//! use tower::{service_fn, Layer, ServiceExt};
//! use tower_retry_safety::deadline::Inbound;
//! use tower_idempotency_keys::deadline::DeadlineLayer;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = DeadlineLayer::new(Duration::from_secs(10));
//! let svc = layer.layer(service_fn(|req: http::Request<String>| async move {
//!     // The deadline the caller asked for, capped at 10 s.
//!     let inbound = req.extensions().get::<Inbound>().copied().expect("set by the layer");
//!     assert!(inbound.remaining() <= Duration::from_millis(250));
//!     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
//! }));
//! let req = http::Request::get("/")
//!     .header("request-timeout-ms", "250")
//!     .body(String::new())?;
//! let res = svc.oneshot(req).await?;
//! assert_eq!(res.status(), 200);
//! # Ok(()) }
//! ```
//!
//! # What it reads
//!
//! No HTTP standard carries a deadline, so the layer reads every convention real clients
//! send, each header by lookup (a request that names none pays a few lookups; reading allocates
//! nothing, and the caller's [`Inbound`](tower_retry_safety::deadline::Inbound) put in the
//! request's extensions costs the map's first insert, as any extension does):
//!
//! | who | deadline | attempt |
//! |---|---|---|
//! | gRPC (A6) | `grpc-timeout` | `grpc-previous-rpc-attempts` |
//! | Connect | `connect-timeout-ms` | — |
//! | Envoy | `x-envoy-expected-rq-timeout-ms` | `x-envoy-attempt-count` |
//! | Stainless SDKs (OpenAI's, Anthropic's) | `x-stainless-read-timeout` (seconds, with a fraction), `x-stainless-timeout` (whole seconds, truncated) | `x-stainless-retry-count` |
//! | AWS SDKs | — | `amz-sdk-request: attempt=N; max=M` |
//! | ours ([`timeout_header`](DeadlineLayer::timeout_header), [`attempt_header`](DeadlineLayer::attempt_header)) | `request-timeout-ms` | `request-attempt` |
//!
//! - The **earliest** deadline named wins, and it is capped by [`DeadlineLayer::new`]'s
//!   maximum (a request that names none gets that maximum): a header from a client the
//!   server does not trust only ever shortens work.
//! - `x-stainless-timeout` is whole seconds cut down by its sender (OpenAI's Node SDK sends a
//!   500 ms timeout as `0`): `n` is read as `n + 1` seconds — "under a second", never
//!   "already gone".
//! - An **attempt** header in any convention says the caller retries
//!   ([`Inbound::caller_retries`](tower_retry_safety::deadline::Inbound::caller_retries)): a
//!   nested policy may then resend less
//!   ([`retries_when_caller_retries`](tower_retry_safety::RetryPolicyBuilder::retries_when_caller_retries)).
//!   A Stainless SDK sends `x-stainless-retry-count: 0` on its first attempt, from the loop
//!   that retries: its presence is enough. AWS's `max=1` says the SDK makes one attempt.
//! - Values are digits only (a fraction where the table says so), of bounded length; a
//!   malformed or overlong one is ignored, and the answer says so in [`DEADLINE_NOTE`]
//!   (`ignored-malformed; x-stainless-read-timeout`), as it says when the deadline was capped.
//!
//! # What it does
//!
//! - The deadline counts from the request's **arrival** (the layer's `call`): the layer is
//!   always ready, and the wait for the inner service to be ready (a `ConcurrencyLimit`'s
//!   permit, a `RateLimit`'s slot) happens in the response future, on the inner service's own
//!   clone, timed by the deadline. A caller whose deadline passes during that wait is
//!   answered then, `504` (a gRPC call: `DEADLINE_EXCEEDED`), and nothing inside runs.
//! - A request whose deadline has passed when the inner service is ready is answered the
//!   same way. Behind it the idempotency layer checks again right before it calls the
//!   handler (after reading the body and claiming the key), and frees the key: the handler
//!   provably did not run.
//! - A handler that has started is never cancelled for the deadline (a keyed handler always
//!   runs to completion and its answer is stored).
//! - The deadline is in the request's extensions (an
//!   [`Inbound`](tower_retry_safety::deadline::Inbound); with `axum`, the
//!   [`CallerDeadline`] extractor); the inner service's future runs in its scope, and so does
//!   each poll of the response body: a nested call made while a streamed body is sent
//!   inherits it too. A task the handler spawns does not inherit a task-local: scope it with
//!   the extension's value.
//!
//! # Where it goes
//!
//! **Outermost**, above every layer that can make a request wait: a wait above it happens
//! before the request reaches it, and no layer can count it. Placed inside the idempotency
//! layer it still works — its answer is marked, and the idempotency layer frees the key
//! rather than store the `504` for every retry — but its deadline then counts from after the
//! body was read and the key claimed.
//!
//! A layer below it that waits *after* it was called, rather than in `poll_ready` — a
//! `Buffer` (its worker waits for the service behind it), or a limit inside an axum route —
//! holds the request where no layer above can see: gate the handler itself, at its start,
//! on the request's `Inbound` (or [`deadline::current`](tower_retry_safety::deadline::current)
//! where the task-local reaches):
//!
//! ```
//! use tower_retry_safety::deadline::Inbound;
//!
//! async fn handler(req: http::Request<String>) -> http::Response<String> {
//!     if req.extensions().get::<Inbound>().is_some_and(Inbound::has_passed) {
//!         // The caller has gone: do nothing it will not read.
//!         let mut res = http::Response::new(String::new());
//!         *res.status_mut() = http::StatusCode::GATEWAY_TIMEOUT;
//!         return res;
//!     }
//!     http::Response::new("done".to_owned())
//! }
//! # let _ = handler;
//! ```

mod answer;
mod aws;
mod body;
mod conventions;
mod count;
#[cfg(feature = "axum")]
mod extract;
pub mod future;
mod layer;
mod note;
mod seconds;

pub(crate) use answer::NothingRan;
#[cfg(feature = "axum")]
pub use extract::CallerDeadline;
pub use layer::{Deadline, DeadlineLayer};
pub use note::DEADLINE_NOTE;
