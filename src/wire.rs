//! The wire's rules as this crate reads them, for code on the other side of the wire (the
//! `tower-idempotency-keys` server layer reads requests with the same rules the client writes
//! them with): the idempotency key's grammar, gRPC's headers and status, and `Retry-After`.
//! Every value a peer sends is read without panicking; a malformed one is `None`.
//!
//! ```
//! use http::HeaderValue;
//! use tower_retry_safety::wire;
//!
//! let key = HeaderValue::from_static("\"8e03978e-40d5-43e8-bc93-6894a57f9324\"");
//! assert_eq!(
//!     wire::idempotency_key(&key),
//!     Some("8e03978e-40d5-43e8-bc93-6894a57f9324")
//! );
//! assert_eq!(wire::grpc::status_code(&HeaderValue::from_static("14")), Some(14));
//! ```

/// The `Idempotency-Key` header's value (draft-ietf-httpapi-idempotency-key-header): the key,
/// or `None` when it is empty, over 255 bytes, or not a Structured Field string (a bare token
/// of visible ASCII is accepted too, as many APIs send one).
pub use crate::classify::idempotency_key::parse as idempotency_key;
/// A `Retry-After` value (delay-seconds or an HTTP-date, RFC 9110 §10.2.3), as a wait from
/// `now`.
pub use crate::classify::retry_after::parse_retry_after;

/// gRPC over HTTP/2: the headers and trailers this crate reads and writes.
pub mod grpc {
    pub use crate::classify::grpc::{
        is_call, is_grpc, is_trailers_only, status_code, GRPC_STATUS, GRPC_TIMEOUT,
        PREVIOUS_ATTEMPTS, PUSHBACK,
    };
}
