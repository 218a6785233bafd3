//! Response bodies as part of the attempt: [`ReadWholeLayer`], inside
//! [`RetrySafety`](crate::service::RetrySafety), reads a body within a limit before the layer decides,
//! so that a body cut mid-way is a failed attempt the layer can recover (read again, or sent
//! again with the same idempotency key), and never a write sent twice.
//!
//! ```
//! use tower::ServiceBuilder;
//! use tower_retry_safety::resume::ReadWholeLayer;
//! use tower_retry_safety::RetryPolicy;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let client = tower::service_fn(|_req: http::Request<String>| async {
//! #     Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(bytes::Bytes::new())))
//! # });
//! let svc = ServiceBuilder::new()
//!     .layer(RetryPolicy::builder().build()?)
//!     .layer(ReadWholeLayer::new())
//!     .service(client);
//! # let _ = svc;
//! # Ok(()) }
//! ```
#![doc = include_str!("../docs/read_whole.md")]

mod body;
pub(crate) mod cut;
pub mod future;
mod layer;
#[cfg(feature = "reqwest-middleware")]
mod middleware;
pub(crate) mod range;
mod report;
pub(crate) mod resumer;
mod service;

pub use body::WholeBody;
pub use cut::{BodyCutError, NoResume};
pub use layer::{ReadWholeLayer, DEFAULT_READ_LIMIT};
pub use report::BodyReport;
pub use service::ReadWhole;

#[cfg(feature = "reqwest-middleware")]
pub use middleware::ReadWholeMiddleware;

#[cfg(feature = "reqwest-middleware")]
pub(crate) use service::ReadPlan;
