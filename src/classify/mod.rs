//! The two verdicts behind every retry decision.
//!
//! - [`RequestVerdict`]: is a repeat of this request harmless? Decided by
//!   [`RetryPolicy::classify`](crate::policy::RetryPolicy::classify) from, highest precedence first, a
//!   marker in the request's extensions, a route rule, an `Idempotency-Key` header (when the
//!   policy honours keys) and the method.
//! - [`FailureClass`]: what do we know about a failed attempt? [`classify_error`] walks an
//!   error's `source()` chain; [`RetryPolicy::classify_response`](crate::policy::RetryPolicy::classify_response)
//!   looks at a response's status and hints.
//!
//! Both are public so that SDKs with their own retry loop can reuse them.

mod body_verdict;
pub(crate) mod failure;
pub(crate) mod grpc;
pub(crate) mod host;
pub(crate) mod idempotency_key;
pub(crate) mod request;
pub(crate) mod response;
pub(crate) mod retry_after;
pub(crate) mod routes;
mod spelling;
pub(crate) mod statuses;
mod symptom;

pub(crate) use body_verdict::BodyVerdict;
pub(crate) use failure::classify_error_with;
pub use failure::{classify_error, Classification, StackErrors};
pub use request::{RequestVerdict, VerdictSource};

pub(crate) use failure::FailureClass;
pub(crate) use request::{Idempotency, NoRetry};
pub(crate) use symptom::Symptom;
