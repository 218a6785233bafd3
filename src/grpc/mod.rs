#![cfg(feature = "tonic")]
#![cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
//! gRPC over tonic (feature `tonic`): the layer on a `tonic::transport::Channel`.
//!
//! tonic is a tower stack over hyper, so the [`RetryPolicy`](crate::policy::RetryPolicy) layer goes
//! directly on a `Channel`, under the generated client:
//!
//! ```
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_retry_safety::{grpc, RetryPolicy};
//!
//! # fn demo(descriptors: &prost_types::FileDescriptorSet) -> Result<(), Box<dyn std::error::Error>> {
//! let endpoint = "http://127.0.0.1:50051";
//! let channel = tonic::transport::Endpoint::from_static(endpoint).connect_lazy();
//! let policy = RetryPolicy::builder()
//!     .grpc_descriptors(descriptors) // NO_SIDE_EFFECTS and IDEMPOTENT methods are reads
//!     .honor_idempotency_key_for_host("127.0.0.1")
//!     .attempt_timeout(Duration::from_millis(500))
//!     .build()?;
//! let svc = ServiceBuilder::new()
//!     .map_err(grpc::into_status)
//!     .layer(policy.for_origin(endpoint)?) // the channel's endpoint: calls carry no host
//!     .service(channel);
//! // let client = MyServiceClient::new(svc);
//! # let _ = svc;
//! # Ok(()) }
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! #     demo(&prost_types::FileDescriptorSet::default()).unwrap();
//! # });
//! ```
//!
//! A generated client sends a path alone (`/pkg.Service/Method`): the `Channel` adds its
//! endpoint's authority below the layer. [`RetryPolicy::for_origin`](crate::policy::RetryPolicy::for_origin)
//! gives the layer that endpoint, so host-scoped rules and key trust apply. Building the client
//! `with_origin` does not: the `Channel` replaces the authority it puts in each call's URI, so
//! the layer reads no host from a tonic call's URI. Without an origin the layer fails closed:
//! a host-scoped rule that calls the call a write holds whatever the host, host-scoped
//! `Idempotent` rules and key trust do not apply, [`RequestVerdict::host_unknown`](crate::classify::RequestVerdict::host_unknown) says so, and a
//! warning is logged once.
//!
//! What changes for gRPC:
//!
//! - **The failure class** comes from `grpc-status` in a trailers-only response, per gRFC A6
//!   and the gRPC status-code guide:
//!
//!   | `grpc-status` | class |
//!   |---|---|
//!   | `OK` | final |
//!   | `UNAVAILABLE` | retryable response: a read is repeated, a write is not (the call may have run) |
//!   | `RESOURCE_EXHAUSTED` | retryable response: a throttle; a write is not repeated |
//!   | `DEADLINE_EXCEEDED` | retryable response, within the caller's deadline |
//!   | `ABORTED` | retryable response for a keyed call (the server's "original in flight") or with `grpc-retry-pushback-ms`; final otherwise |
//!   | every other code, and a malformed one | final |
//!
//!   A transport error is classified as for HTTP: a call that provably never left (connect
//!   refused, `REFUSED_STREAM`, tonic's `ConnectError`) is retried for writes too. Response
//!   headers without a `grpc-status` commit the call: it is never retried after them (A6).
//!
//!   These wire rules are the decision core's, in every build: any POST whose `content-type`
//!   is `application/grpc…` is read as a gRPC call, with or without this feature. What this
//!   module adds is tonic's own: its `Body` (which brings tonic's errors to the core, see
//!   [`ReplayBody::stack_errors`](crate::service::ReplayBody::stack_errors)), [`classify_error_with_tonic`]
//!   for a retry loop of your own, descriptor sets, and `Status` conversions.
//! - **The server's hint**: `grpc-retry-pushback-ms` is the wait before the retry; a negative
//!   or unreadable value means "do not retry"; a wait over
//!   [`max_retry_after`](crate::RetryPolicyBuilder::max_retry_after) ends the retries.
//! - **The deadline**: a `grpc-timeout` the caller set (tonic's `Request::set_timeout`) is
//!   the call's deadline, with the policy's
//!   [`deadline`](crate::RetryPolicyBuilder::deadline) if shorter; each attempt is sent with
//!   the time left as its `grpc-timeout`, and a retry with `grpc-previous-rpc-attempts`.
//! - **The request verdict**: route rules on `/package.Service/Method` (every call is a
//!   POST), markers and `idempotency-key` metadata work as for HTTP; [`grpc_descriptors`](crate::RetryPolicyBuilder::grpc_descriptors)
//!   reads each method's `idempotency_level` from the service's descriptor set.
//! - **Bodies**: tonic's `Body` is recorded as it is sent (see
//!   [`ReplayBody`](crate::service::ReplayBody)).
//! - **Errors**: [`into_status`] (for `map_err`) and [`status_of`] turn this crate's
//!   [`Error`](crate::attempts::Error) into a `tonic::Status` that says whether the call may have been
//!   applied, and whose message names the call (`pkg.Service/Method`); a failed status the
//!   server answered carries [`ATTEMPTS_KEY`] and [`MAY_HAVE_BEEN_APPLIED_KEY`] in its
//!   metadata too. [`MayHaveBeenApplied`](crate::attempts::MayHaveBeenApplied) answers for a
//!   `tonic::Status`, as for this crate's error.
//! - **Server**: `tower_idempotency_keys::IdempotencyLayer` in front of a tonic
//!   server reads the key from the `idempotency-key` metadata, sends a stored response again with
//!   its trailers (its `grpc-status`), and answers a gRPC call's conflicts as gRPC statuses
//!   (a key in flight: `ABORTED` with `grpc-retry-pushback-ms`; a key reused with another
//!   call, or malformed: `INVALID_ARGUMENT`).
#![doc = include_str!("../docs/grpc.md")]

mod body;
mod descriptors;
mod errors;
mod status;

pub use errors::classify_error_with_tonic;
pub use status::{into_status, status_of, ATTEMPTS_KEY, MARK_KEY, MAY_HAVE_BEEN_APPLIED_KEY};
