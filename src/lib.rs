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
//! # What it is for
//!
//! - **A tower or hyper-util client.** A [`RetryPolicy`] is a tower `Layer`: put it over any
//!   HTTP client service, such as hyper-util's `Client` ([`RetrySafety`] is its service;
//!   responses carry a [`RetryReport`], errors are an [`struct@Error`]). Streaming request
//!   bodies are recorded for replay ([`Replayable`]).
//! - **A reqwest client.** With the `reqwest-middleware` feature, the same policy drives
//!   [`RetrySafetyMiddleware`] in a reqwest-middleware stack
//!   (`examples/reqwest.rs` in the repository); `RetryReport::of_reqwest` and
//!   [`MayHaveBeenApplied`] read the outcome.
//! - **Response bodies cut mid-way.** Opt in with [`ReadWholeLayer`] inside the layer
//!   (reqwest: `ReadWholeMiddleware`): a body within a limit is read inside the attempt and
//!   read again after a cut; a longer `GET` resumes with `Range` on a strong validator, a keyed
//!   write with the server's replay; a write without a trusted key is never sent twice for it (see [the `resume` module](resume)).
//! - **Deadlines that cross hops.** A request sent from inside a handler inherits the
//!   deadline the handler's request arrived with, and hands its own on (see [the `deadline`
//!   module](deadline)).
//!
//! The server half — a tower layer that honours idempotency keys, over memory, Redis or
//! PostgreSQL — is the `tower-idempotency-keys` crate; the fault lab that proves a client in
//! any language never applies a write twice is `retry-safety-lab`. Both read the wire with
//! this crate's rules ([the `wire` module](wire)).
//!
//! ```
//! use std::time::Duration;
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use hyper_util::{client::legacy::Client, rt::TokioExecutor};
//! use tower::ServiceBuilder;
//! use tower_retry_safety::RetryPolicy;
//!
//! let policy = RetryPolicy::builder()
//!     .attempt_timeout(Duration::from_secs(10)) // each attempt
//!     .deadline(Duration::from_secs(30))        // the whole request, retries included
//!     .build()?;
//! let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
//! let svc = ServiceBuilder::new().layer(policy).service(client);
//! # let _ = svc;
//! # Ok::<(), tower_retry_safety::BuildError>(())
//! ```
//!
//! # Per-call options
//!
//! A [`RequestOptions`] in a request's extensions overrides the policy's `max_retries`,
//! `deadline` and `attempt_timeout` for that request (reqwest: `with_extension`); the
//! [`Idempotency`] and [`NoRetry`] markers say what only the caller knows about it.
//!
//! ```
//! use std::time::Duration;
//! use tower_retry_safety::{Idempotency, RequestOptions};
//!
//! let mut req = http::Request::post("https://api.example.com/v1/reports").body(())?;
//! req.extensions_mut().insert(
//!     RequestOptions::new()
//!         .attempt_timeout(Duration::from_secs(120)) // a slow endpoint
//!         .max_retries(5),
//! );
//! req.extensions_mut().insert(Idempotency::Idempotent); // a POST that only reads
//! # Ok::<(), http::Error>(())
//! ```
//!
//! Set timeouts on the policy (or per call), not with tower's `.timeout()`: a tower
//! timeout *under* the layer cuts every attempt at its own fixed duration, whatever a
//! request's `attempt_timeout` says (the shorter of the two wins), and one *over* the layer
//! cuts the whole request without a report or this crate's error. The policy's own timers
//! classify a cut attempt as ambiguous and keep the report, the request id and the key.
//!
//! # Reading the outcome
//!
//! [`RetryReport::of`] reads the report on a response; with the `reqwest-middleware` feature,
//! `RetryReport::of_reqwest` reads it on a `reqwest::Response` and
//! `Error::from_reqwest_middleware` finds this crate's [`struct@Error`] in a
//! `reqwest_middleware::Error`. Before telling a caller that a write did not happen, ask
//! [`RetryReport::may_have_been_applied`] (or [`Error::is_ambiguous`], or
//! [`MayHaveBeenApplied`] of any of them).
//!
#![doc = include_str!("docs/spans.md")]
//!
//! # Cargo features
//!
//! - `h2` (default): classify HTTP/2 `REFUSED_STREAM` resets as *not sent*. A remote `GOAWAY`
//!   stays *ambiguous*: hyper can report one for a request it already wrote.
//! - `reqwest-middleware`: the reqwest-middleware adapter, reqwest error classification, and
//!   `reqwest::Body` as a [`ReplayBody`] (hyper-util's `Client<_, reqwest::Body>` behind the
//!   layer).
//! - `tonic`: the front end for tonic 0.14 (the `grpc` module): `tonic::body::Body` as a
//!   [`ReplayBody`] that brings tonic's own errors (`ConnectError` not sent), verdicts from a
//!   proto's `idempotency_level`, this crate's error as a `tonic::Status`. gRPC's wire rules
//!   need no feature: a POST with `content-type: application/grpc…` is read as a gRPC call
//!   (its failure class from `grpc-status`, its deadline from `grpc-timeout`) in every build,
//! - `axum`: axum's `Body` as a [`ReplayBody`].
//! - `opentelemetry`: the client's metrics through a `Meter` you hand over ([the `metrics`
//!   module](metrics)).
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod attempt_clock;
mod attempts;
mod backoff;
mod body_hint;
mod budget;
mod build_error;
pub mod classify;
pub mod deadline;

// gRPC's front end: its feature gate is inside the module.
pub mod grpc;
mod hedge;
#[cfg(feature = "opentelemetry")]
#[cfg_attr(docsrs, doc(cfg(feature = "opentelemetry")))]
pub mod metrics;
pub mod peek;
pub mod policy;
#[cfg(feature = "reqwest-middleware")]
mod reqwest;
pub mod resume;
pub mod service;
mod target;
mod timed_out;
pub mod wire;

#[doc(inline)]
pub use attempts::{Error, MayHaveBeenApplied};
#[doc(inline)]
pub use budget::LockFreeBudget;
#[doc(inline)]
pub use classify::{
    classify_error, Classification, FailureClass, Idempotency, NoRetry, RequestVerdict,
    VerdictSource,
};
#[doc(inline)]
pub use hedge::Hedge;
#[doc(inline)]
pub use peek::{PeekBody, PeekBodyLayer, PeekedBody};
#[doc(inline)]
pub use policy::{
    AttemptEvent, BuildError, Decision, RequestOptions, RetryPolicy, RetryPolicyBuilder, StopReason,
};
#[cfg(feature = "reqwest-middleware")]
#[doc(inline)]
pub use reqwest::{PeekBodyMiddleware, ReadWholeMiddleware, RetrySafetyMiddleware};
#[doc(inline)]
pub use resume::{ReadWhole, ReadWholeLayer, WholeBody};
#[doc(inline)]
pub use service::{
    attempt_number, AttemptOutcome, NotReplayable, Recorded, ReplayBody, ReplayBuffer, Replayable,
    ResponseFuture, RetryReport, RetrySafety,
};
/// The trait of retry budgets that [`RetryPolicyBuilder::budget`] takes (tower's), re-exported
/// so a custom budget needs no `tower` import; [`TpsBudget`] is tower's implementation.
pub use tower::retry::budget::{Budget, TpsBudget};

/// The boxed error type that inner services' errors are converted into.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
