//! The tower middleware: [`RetrySafety`], made by [`RetryPolicy`](crate::policy::RetryPolicy)'s
//! [`Layer`](tower::Layer) impl.
//!
//! Put it outside a per-attempt timeout, over any HTTP client service:
//!
//! ```
//! use std::time::Duration;
//! use http_body_util::Full;
//! use bytes::Bytes;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use tower::ServiceBuilder;
//! use tower_retry_safety::RetryPolicy;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
//! let svc = ServiceBuilder::new()
//!     .layer(RetryPolicy::builder().max_retries(3).build()?)
//!     .timeout(Duration::from_secs(10)) // per attempt: its `Elapsed` is ambiguous
//!     .service(client);
//! # let _ = svc;
//! # Ok(()) }
//! ```
//!
//! For each request the service classifies the request, sends it, classifies the outcome and
//! asks the policy whether to retry. Before each retry it waits the backoff or the server's
//! Retry-After, then waits for the inner service to be ready. Attempts it makes are marked in
//! the request's extensions, so a second layer of this crate further in does not retry them
//! again. A response is always returned with its
//! [`RetryReport`](crate::attempts::RetryReport), even when retries ended on it; an
//! [`Error`](crate::attempts::Error) is returned only when the last attempt ended in an error.
//!
//! Dropping the response future stops everything: nothing more is sent.
//!
//! Each attempt is a `tracing` span (`HTTP attempt`, target `tower_retry_safety::attempt`)
//! with OpenTelemetry's HTTP client fields and the crate's decisions, entered around the inner
//! service's `call` and every poll; [`attempt_number`] reads an attempt's number further in.
//! Without a subscriber that wants INFO spans, none is made.
#![doc = include_str!("../docs/bodies.md")]

pub(crate) mod body;
pub mod future;
mod hedged;
pub(crate) mod kept;
mod layer;
pub(crate) mod replay;
mod send;
#[allow(clippy::module_inception)]
pub(crate) mod service;

pub use crate::attempts::{attempt_number, AttemptOutcome, NotReplayable};
pub use replay::{Recorded, ReplayBuffer, Replayable};

pub(crate) use crate::attempts::{AttemptNumber, KeyHeader, LayerAttempt};
pub(crate) use body::ReplayBody;
pub(crate) use service::RetrySafety;
