//! The conventions an HTTP request's deadline and attempt number are written in: no HTTP
//! standard exists, so a client speaks the one its server reads.

use http::HeaderName;

/// How an HTTP request carries its deadline and attempt number: the headers a host's server
/// reads. Picked per host with
/// [`send_deadline_to_as`](crate::RetryPolicyBuilder::send_deadline_to_as). A gRPC call
/// always carries gRPC's own (`grpc-timeout`, `grpc-previous-rpc-attempts`).
///
/// Every value is the time until the client stops waiting for *that attempt*, in whole
/// milliseconds rounded down, and the attempt's number from 1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Convention {
    /// This crate's: [`TIMEOUT_HEADER`](super::TIMEOUT_HEADER) (`request-timeout-ms`) and
    /// [`ATTEMPT_HEADER`](super::ATTEMPT_HEADER) (`request-attempt`).
    #[default]
    Own,
    /// Envoy's, as it sends them to its upstream: `x-envoy-expected-rq-timeout-ms` and
    /// `x-envoy-attempt-count`.
    Envoy,
    /// The Connect protocol's `connect-timeout-ms`; Connect has no attempt number.
    Connect,
}

/// Envoy's deadline header.
pub const ENVOY_TIMEOUT_HEADER: HeaderName =
    HeaderName::from_static("x-envoy-expected-rq-timeout-ms");
/// Envoy's attempt number, from 1.
pub const ENVOY_ATTEMPT_HEADER: HeaderName = HeaderName::from_static("x-envoy-attempt-count");
/// The Connect protocol's deadline header.
pub const CONNECT_TIMEOUT_HEADER: HeaderName = HeaderName::from_static("connect-timeout-ms");

impl Convention {
    /// The header the time left goes in, in whole milliseconds.
    pub fn timeout_header(self) -> HeaderName {
        match self {
            Convention::Own => super::TIMEOUT_HEADER,
            Convention::Envoy => ENVOY_TIMEOUT_HEADER,
            Convention::Connect => CONNECT_TIMEOUT_HEADER,
        }
    }

    /// The header the attempt's number goes in, if the convention has one.
    pub fn attempt_header(self) -> Option<HeaderName> {
        match self {
            Convention::Own => Some(super::ATTEMPT_HEADER),
            Convention::Envoy => Some(ENVOY_ATTEMPT_HEADER),
            Convention::Connect => None,
        }
    }
}
