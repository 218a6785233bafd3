//! gRPC over tonic (feature `tonic`): the layer on a `tonic::transport::Channel`.
//!
//! tonic is a tower stack over hyper, so the [`RetryPolicy`](crate::RetryPolicy) layer goes
//! directly on a `Channel`, under the generated client. What changes for gRPC:
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
//!   refused, `REFUSED_STREAM`) is retried for writes too. Response headers without a
//!   `grpc-status` commit the call: it is never retried after them (A6).
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
//!   [`ReplayBody`](crate::ReplayBody)).
//! - **Errors**: [`status_of`] turns this crate's [`Error`](crate::Error) into a
//!   `tonic::Status` that says whether the call may have been applied.

mod body;
mod status;

pub use status::{into_status, status_of, ATTEMPTS_KEY, MAY_HAVE_BEEN_APPLIED_KEY};
