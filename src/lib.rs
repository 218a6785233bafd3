//! Retries for HTTP clients that never repeat a write that may have been applied.
//!
//! A timeout does not mean the server did nothing: it may have applied a write and only the
//! response was lost. Retrying such a request automatically repeats its side effect — the same
//! email sent twice, the same card charged twice. RFC 9110 §9.2.2 says a client SHOULD NOT
//! automatically retry a non-idempotent request unless it knows the request was never applied.
//!
//! This crate retries what is safe and only that.
//!
//! # The decision model
//!
//! For every request the crate reaches two verdicts:
//!
//! - **Is a repeat harmless?** ([`RequestVerdict`]) — from a marker the caller put in the
//!   request's extensions ([`NoRetry`], [`Idempotency`]), a route rule (method + path template),
//!   an `Idempotency-Key` header where the target is trusted to honour keys (unscoped, or per
//!   host: see [`RetryPolicyBuilder::honor_idempotency_key`]), or the method (RFC 9110).
//! - **What do we know about the failed attempt?** ([`FailureClass`]) — it provably never reached
//!   the server (*not sent*), it may have been applied (*ambiguous*), the server asked for a retry
//!   (*retryable response*), or there is nothing to gain from repeating (*final*).
//!
//! | | not sent | ambiguous | retryable response | final |
//! |---|---|---|---|---|
//! | idempotent (or keyed, key trusted) | retry | retry | retry, honouring Retry-After | return |
//! | non-idempotent | retry | **suppress** | **suppress** | return |
//! | [`NoRetry`] | return | return | return | return |
//!
//! A retry also needs the request's body again: a copyable body is copied, a streaming one is
//! recorded as it is sent, within the policy's
//! [`replay_buffer`](RetryPolicyBuilder::replay_buffer) (see [`Replayable`]); a classifier
//! that knows the API can read response bodies ([`PeekBodyLayer`]).
//!
//! A suppressed retry is never silent: responses carry a [`RetryReport`], and errors are a
//! [`struct@Error`] whose [`is_ambiguous`](Error::is_ambiguous) tells the caller that the write
//! may have happened and that they should check before retrying by hand.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use http::Method;
//! use tower_retry_safety::{Idempotency, RetryPolicy, VerdictSource};
//!
//! let policy = RetryPolicy::builder()
//!     // A search is a read even though it is a POST.
//!     .route(Method::POST, "/v1/search", Idempotency::Idempotent)
//!     .max_retries(3)
//!     .backoff(Duration::from_millis(100), Duration::from_secs(2))
//!     .build()?;
//!
//! let search = http::Request::post("https://api.example.com/v1/search").body(())?;
//! let verdict = policy.classify(&search);
//! assert_eq!(verdict.idempotency(), Idempotency::Idempotent);
//! assert_eq!(verdict.source(), VerdictSource::Route);
//!
//! let send = http::Request::post("https://api.example.com/v1/messages").body(())?;
//! assert_eq!(policy.classify(&send).idempotency(), Idempotency::NonIdempotent);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The policy is a [`tower::Layer`]: `ServiceBuilder::new().layer(policy).timeout(per_attempt)`
//! over any HTTP client service (see [`RetrySafety`]). With the `reqwest-middleware` feature the
//! same policy drives `RetrySafetyMiddleware` in a reqwest-middleware stack.
//!
//! # Reading the outcome
//!
//! [`RetryReport::of`] reads the report on a response; with the `reqwest-middleware` feature,
//! `RetryReport::of_reqwest` reads it on a `reqwest::Response` and
//! `Error::from_reqwest_middleware` finds this crate's [`struct@Error`] in a
//! `reqwest_middleware::Error`.
//!
//! # Cargo features
//!
//! - `h2` (default): classify HTTP/2 `REFUSED_STREAM` resets as *not sent*. A remote `GOAWAY`
//!   stays *ambiguous*: hyper can report one for a request it already wrote.
//! - `reqwest-middleware`: the reqwest-middleware adapter, reqwest error classification, and
//!   `reqwest::Body` as a [`ReplayBody`] (hyper-util's `Client<_, reqwest::Body>` behind the
//!   layer).
//! - `redis`: `server::RedisStore`, idempotency keys shared by a fleet through Redis.
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod attempts;
mod backoff;
mod body_hint;
mod budget;
pub mod classify;
mod error;
pub mod peek;
pub mod policy;
#[cfg(feature = "reqwest-middleware")]
mod reqwest;
pub mod server;
pub mod service;
mod timed_out;

pub use budget::LockFreeBudget;
pub use classify::{
    classify_error, Classification, FailureClass, Idempotency, NoRetry, RequestVerdict,
    VerdictSource,
};
pub use error::{Error, MayHaveBeenApplied};
pub use peek::{PeekBody, PeekBodyLayer, PeekedBody};
pub use policy::{
    AttemptEvent, BuildError, Decision, RequestOptions, RetryPolicy, RetryPolicyBuilder, StopReason,
};
#[cfg(feature = "reqwest-middleware")]
pub use reqwest::{PeekBodyMiddleware, RetrySafetyMiddleware};
pub use service::{
    AttemptRecord, NotReplayable, Recorded, ReplayBody, ReplayBuffer, Replayable, ResponseFuture,
    RetryReport, RetrySafety,
};
/// The trait of retry budgets that [`RetryPolicyBuilder::budget`] takes (tower's), re-exported
/// so a custom budget needs no `tower` import; [`TpsBudget`] is tower's implementation.
pub use tower::retry::budget::{Budget, TpsBudget};

/// The boxed error type that inner services' errors are converted into.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
