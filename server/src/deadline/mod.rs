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
//! What the layer reads: `grpc-timeout` on a gRPC call, the
//! [`TIMEOUT_HEADER`](tower_retry_safety::deadline::TIMEOUT_HEADER) on any other request. A
//! caller cannot buy more time than the server allows: the deadline is capped by
//! [`DeadlineLayer::new`]'s maximum (and a request that names none gets that maximum), so a
//! header from a client the server does not trust only ever shortens work. A malformed or
//! overlong value is ignored; the answer says so in
//! [`DEADLINE_NOTE`], as it says when a deadline was capped.
//!
//! What it does with it:
//! - a request whose deadline has passed when the inner service is called is answered at
//!   once, `504` (a gRPC call: `DEADLINE_EXCEEDED`), and nothing inside runs; behind it the
//!   idempotency layer does the same after it claims a key, and frees the key — the handler
//!   provably did not run;
//! - a handler that has started is never cancelled for the deadline (a keyed handler always
//!   runs to completion and its answer is stored);
//! - the deadline is in the request's extensions (an
//!   [`Inbound`](tower_retry_safety::deadline::Inbound); with `axum`, the
//!   [`CallerDeadline`] extractor), and the inner service's future runs in its scope. A task
//!   the handler spawns does not inherit a task-local: scope it with the extension's value.
//! - a request that carried an attempt number (`request-attempt`, or gRPC's
//!   `grpc-previous-rpc-attempts`) comes from a caller that retries
//!   ([`Inbound::caller_retries`](tower_retry_safety::deadline::Inbound::caller_retries)): a
//!   nested policy may then resend less
//!   ([`retries_when_caller_retries`](tower_retry_safety::RetryPolicyBuilder::retries_when_caller_retries)).

mod answer;
#[cfg(feature = "axum")]
mod extract;
mod future;
mod layer;

pub use answer::DEADLINE_NOTE;
#[cfg(feature = "axum")]
pub use extract::CallerDeadline;
pub use future::ResponseFuture;
pub use layer::{Deadline, DeadlineLayer};
