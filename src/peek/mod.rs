//! Response bodies classified by what they say: [`PeekBodyLayer`] reads the beginning of a
//! response's body, inside [`RetrySafety`](crate::service::RetrySafety), so that a classifier that
//! knows the API can tell the layer what the response means (a 200 whose JSON says "rate
//! limited", a documented "not processed" code). The reqwest-middleware counterpart is
//! `PeekBodyMiddleware` (feature `reqwest-middleware`).
#![doc = include_str!("../docs/peek.md")]

mod body;
pub(crate) mod classifier;
pub mod future;
mod layer;
#[cfg(feature = "reqwest-middleware")]
mod middleware;
mod service;

pub use body::PeekedBody;
pub use layer::PeekBodyLayer;
pub use service::PeekBody;

#[cfg(feature = "reqwest-middleware")]
pub use middleware::PeekBodyMiddleware;
