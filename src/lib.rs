//! A tower layer that retries HTTP requests but never repeats a write that may have been
//! applied, and tells the caller when it held a resend back.
//!
//! A timeout does not mean the server did nothing: it may have applied a write and only the
//! response was lost. Retrying such a request automatically repeats its side effect — the same
//! email sent twice, the same card charged twice. RFC 9110 §9.2.2 says a client SHOULD NOT
//! automatically retry a non-idempotent request unless it knows the request was never applied.
//! This crate retries what is safe, and only that.
//!
//! ```
//! use std::collections::HashSet;
//! use std::sync::{Arc, Mutex};
//! use std::time::Duration;
//!
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::{TokioExecutor, TokioIo};
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_retry_safety::{MayHaveBeenApplied, RetryPolicy, RetryReport, StopReason};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! // A server on loopback that runs every request, but loses its answer to the first request
//! // on each path: the connection drops after the work is done.
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let url = format!("http://{}", listener.local_addr()?);
//! let ran = Arc::new(Mutex::new(Vec::new()));
//! let server_ran = ran.clone();
//! tokio::spawn(async move {
//!     let answered = Arc::new(Mutex::new(HashSet::new()));
//!     while let Ok((stream, _)) = listener.accept().await {
//!         let (ran, answered) = (server_ran.clone(), answered.clone());
//!         let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
//!             let (ran, answered) = (ran.clone(), answered.clone());
//!             async move {
//!                 let line = format!("{} {}", req.method(), req.uri().path());
//!                 let _ = req.into_body().collect().await; // read the whole request
//!                 ran.lock().unwrap().push(line.clone()); // the work is done...
//!                 if answered.lock().unwrap().insert(line) {
//!                     return Err(std::io::Error::other("crashed")); // ...and its answer lost
//!                 }
//!                 Ok(Response::new(Full::new(Bytes::from_static(b"{\"id\":1}"))))
//!             }
//!         });
//!         let conn = hyper::server::conn::http1::Builder::new();
//!         tokio::spawn(async move { conn.serve_connection(TokioIo::new(stream), svc).await });
//!     }
//! });
//!
//! // The client: hyper-util's, under the layer.
//! let policy = RetryPolicy::builder()
//!     .max_retries(3)
//!     .backoff(Duration::from_millis(50), Duration::from_secs(2))
//!     .attempt_timeout(Duration::from_secs(10))
//!     .build()?;
//! let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
//! let svc = ServiceBuilder::new().layer(policy).service(client);
//!
//! // A write: its first answer is lost, so it may have been applied. It is not sent again.
//! let send = Request::post(format!("{url}/v1/messages")).body(Full::from("{\"to\":\"a\"}"))?;
//! let err = svc.clone().oneshot(send).await.unwrap_err();
//! assert!(err.may_have_been_applied()); // check before sending it again by hand
//! let report = err.report().expect("the layer made an attempt");
//! assert_eq!(report.stop_reason(), StopReason::SuppressedNotIdempotent);
//! assert_eq!(report.attempts(), 1);
//!
//! // A read: its first answer is lost too, and it is sent again.
//! let read = Request::get(format!("{url}/v1/messages/1")).body(Full::default())?;
//! let res = svc.clone().oneshot(read).await?;
//! assert_eq!(RetryReport::of(&res).map(RetryReport::attempts), Some(2));
//! assert!(RetryReport::of(&res).is_some_and(|r| !r.may_have_been_applied())); // a read
//! assert_eq!(res.into_body().collect().await?.to_bytes(), "{\"id\":1}");
//!
//! // The server ran the write once.
//! let ran = ran.lock().unwrap().clone();
//! assert_eq!(ran, ["POST /v1/messages", "GET /v1/messages/1", "GET /v1/messages/1"]);
//! # Ok(()) }
//! ```
//!
//! # Modules
//!
//! The crate root holds what a first stack needs; everything else is in a module named for
//! what it holds:
//!
//! - [`policy`]: what is retried and why — the decision after each attempt and what a hook sees.
//! - [`classify`]: the two verdicts behind it (is a repeat harmless, what is known of a failure),
//!   for SDKs with a retry loop of their own.
//! - [`service`]: the tower service's parts — request bodies kept for a resend, each attempt's
//!   outcome and number, its future.
//! - [`budget`]: retry budgets — [`LockFreeBudget`](budget::LockFreeBudget), the default, and
//!   tower's.
//! - [`peek`]: response bodies classified by what they say.
//! - [`resume`]: response bodies read inside the attempt, and read again or resumed after a cut.
//! - [`deadline`]: deadlines that cross hops, from a caller to the services it calls.
//! - [`grpc`]: the front end for tonic (feature `tonic`).
//! - [`metrics`]: OpenTelemetry metrics (feature `opentelemetry`).
//! - [`wire`]: the wire's rules (the idempotency key's grammar, gRPC's headers, `Retry-After`),
//!   shared with the server crate.
//!
//! # The decision model
//!
//! For every request the crate reaches two verdicts:
//!
//! - **Is a repeat harmless?** ([`RequestVerdict`](classify::RequestVerdict)) — from a marker the
//!   caller put in the request's extensions ([`NoRetry`], [`Idempotency`]), a route rule (method +
//!   path template), an `Idempotency-Key` header where the target is trusted to honour keys
//!   (unscoped, or per host: see [`RetryPolicyBuilder::honor_idempotency_key`]), or the method
//!   (RFC 9110).
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
//! [`replay_buffer`](RetryPolicyBuilder::replay_buffer) (see [`Replayable`](service::Replayable));
//! a classifier that knows the API can read response bodies ([`PeekBodyLayer`](peek::PeekBodyLayer)).
//!
//! # Reading the outcome
//!
//! A suppressed retry is never silent. A response carries a [`RetryReport`]
//! ([`RetryReport::of`]); an error is this crate's [`struct@Error`]. Two questions, two answers:
//!
//! - **Was the write applied?** [`may_have_been_applied`](Error::may_have_been_applied) (on the
//!   error, on the report, or through [`MayHaveBeenApplied`] for either) is `false` only when no
//!   attempt can have reached the server's application, and always `false` for a read. Ask it
//!   before telling a caller that a write did not happen.
//! - **What is known of the failure?** [`is_ambiguous`](Error::is_ambiguous) says that an
//!   attempt may have reached the server — for any request, a read too (a GET that timed out is
//!   ambiguous but applied nothing); [`is_not_sent`](Error::is_not_sent) is its opposite.
//!
//! The report's [`stop_reason`](RetryReport::stop_reason) says why there was no further attempt
//! ([`StopReason::SuppressedNotIdempotent`] for a suppressed resend), and the error's `Display`
//! says what happened and what to do next. With the `reqwest-middleware` feature,
//! `RetryReport::of_reqwest` reads the report on a `reqwest::Response` and
//! `Error::from_reqwest_middleware` finds this crate's error in a `reqwest_middleware::Error`.
//!
//! # Front ends
//!
//! - **A tower or hyper-util client**: a [`RetryPolicy`] is a tower `Layer`; [`RetrySafety`] is
//!   its service. Streaming request bodies are recorded for replay
//!   ([`Replayable`](service::Replayable)).
//! - **A reqwest client**: with the `reqwest-middleware` feature, the same policy drives
//!   [`RetrySafetyMiddleware`] in a reqwest-middleware stack (`examples/reqwest.rs` in the
//!   repository).
//! - **gRPC**: with the `tonic` feature, the layer goes on a `tonic::transport::Channel` (see
//!   [the `grpc` module](grpc)).
//! - **Response bodies cut mid-way**: opt in with
//!   [`ReadWholeLayer`](resume::ReadWholeLayer) inside the layer (reqwest:
//!   `ReadWholeMiddleware`): a body within a limit is read inside the attempt and read again
//!   after a cut; a longer `GET` resumes with `Range` on a strong validator, a keyed write with
//!   the server's stored response; a write without a trusted key is never sent twice for it
//!   (see [the `resume` module](resume)).
//!
//! A [`RequestOptions`] in a request's extensions overrides the policy's `max_retries`,
//! `deadline` and `attempt_timeout` for that request (reqwest: `with_extension`); the
//! [`Idempotency`] and [`NoRetry`] markers say what only the caller knows about it.
//!
//! Set timeouts on the policy (or per call), not with tower's `.timeout()`: a tower
//! timeout *under* the layer cuts every attempt at its own fixed duration, whatever a
//! request's `attempt_timeout` says (the shorter of the two wins), and one *over* the layer
//! cuts the whole request without a report or this crate's error. The policy's own timers
//! classify a cut attempt as ambiguous and keep the report, the request id and the key.
//!
//! The server half — a tower layer that honours idempotency keys, over memory, Redis or
//! PostgreSQL — is the `tower-idempotency-keys` crate; the fault lab that proves a client in
//! any language never applies a write twice is `retry-safety-lab`. Both read the wire with
//! this crate's rules ([the `wire` module](wire)).
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
//!   (its failure class from `grpc-status`, its deadline from `grpc-timeout`) in every build.
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
mod box_error;
pub mod budget;
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

// What a user writes in a first stack: at most 16 names. Each is public here only; everything
// else is public in the module named for what it holds.
#[doc(inline)]
pub use attempts::{Error, MayHaveBeenApplied, RetryReport};
#[doc(inline)]
pub use box_error::BoxError;
#[doc(inline)]
pub use build_error::BuildError;
#[doc(inline)]
pub use classify::failure::FailureClass;
#[doc(inline)]
pub use classify::request::{Idempotency, NoRetry};
#[doc(inline)]
pub use hedge::Hedge;
#[doc(inline)]
pub use policy::builder::RetryPolicyBuilder;
#[doc(inline)]
pub use policy::decision::StopReason;
#[doc(inline)]
pub use policy::options::RequestOptions;
#[doc(inline)]
pub use policy::retry_policy::RetryPolicy;
#[cfg(feature = "reqwest-middleware")]
#[doc(inline)]
pub use reqwest::RetrySafetyMiddleware;
#[doc(inline)]
pub use service::body::ReplayBody;
#[doc(inline)]
pub use service::service::RetrySafety;
