//! A fault lab for any HTTP client: a proxy that gives each operation's first attempt one of
//! production's faults and counts the writes its upstream applied twice, and a conformance
//! check for servers that honour `Idempotency-Key` — to prove, in CI, that an SDK in any
//! language never applies a write twice.
//!
//! A tower client stack through the lab's proxy and upstream, on loopback, with the default
//! mix of faults: 12 writes and 12 reads, and what the proxy counted.
//!
//! ```
//! use std::time::Duration;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use tower::ServiceBuilder;
//! use tower_retry_safety::RetryPolicy;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let client = Client::builder(TokioExecutor::new()).build_http();
//! let policy = RetryPolicy::builder()
//!     .attempt_timeout(Duration::from_secs(1))
//!     .build()?;
//! let stack = ServiceBuilder::new().layer(policy).service(client);
//! let report = retry_safety_lab::run_stack(stack, 12).await?;
//! assert_eq!(report.writes(), 12);
//! assert_eq!(report.applied_twice(), 0); // no write reached the upstream twice
//! println!("{}", report.table(0));
//! # Ok(()) }
//! # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
//! ```
//!
//! # Map
//!
//! - [`Proxy`] and its [`ProxyConfig`] (`proxy/`): the fault-injecting reverse proxy; the
//!   [`Fault`]s it gives out (`fault`); what it counted, a [`ProxyReport`] of [`RouteCounts`]
//!   (`report`, kept by the `ledger`); [`run_stack`] runs a tower stack through one
//!   (`stack`).
//! - [`routes`]: [`RouteKinds`](routes::RouteKinds), the `--write` / `--read` rules that tell
//!   a write from a read.
//! - [`op_id`]: [`OpIdentity`](op_id::OpIdentity), how attempts are linked into operations,
//!   and the design behind it.
//! - [`KeysCheck`] (`keys/`): the conformance check, its [`KeysReport`] of [`RuleResult`]s,
//!   each holding a [`RuleVerdict`]; [`headers`]: what it asks of a test deployment.
//! - [`Upstream`] (`serve`): a test upstream behind tower-idempotency-keys' layer.
//! - [`LabError`] (`error`): the one error, a line naming the input at fault.
//! - Inside: `listen` (accept loops), `preface` (HTTP/1.1 or HTTP/2), `h2_serve`,
//!   `frame_filter` and `goaway` (the HTTP/2 server and its GOAWAY faults), `unanswered`,
//!   `multipart` (bodies fingerprinted without their boundary).
//! - The `retry-safety-lab` binary (`src/main.rs` and its own `cli/`, `cargo install
//!   retry-safety-lab`): the same lab as a command line for clients in any language (`proxy`,
//!   `serve`, `keys`, and `demo`: the example above beside `tower::retry` with the policy
//!   people typically write for it, which applies some writes twice).

mod error;
mod fault;
mod frame_filter;
mod goaway;
mod h2_serve;
pub mod headers;
mod keys;
mod ledger;
mod listen;
mod multipart;
pub mod op_id;
mod preface;
mod proxy;
mod report;
pub mod routes;
mod serve;
mod stack;
mod unanswered;

pub use error::LabError;
pub use fault::Fault;
pub use keys::{KeysCheck, KeysReport, RuleResult, RuleVerdict};
pub use proxy::{Proxy, ProxyConfig};
pub use report::{ProxyReport, RouteCounts};
pub use serve::Upstream;
pub use stack::run_stack;
