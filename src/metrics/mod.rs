//! OpenTelemetry metrics (feature `opentelemetry`): what the client's retries did. The server
//! layer (`tower-idempotency-keys`) records its own with the same conventions.
#![doc = include_str!("../docs/metrics.md")]

mod attributes;
pub(crate) mod client;

use http::Method;
use opentelemetry::KeyValue;

/// `http.request.method`, bounded as OpenTelemetry's HTTP conventions ask: a method outside
/// RFC 9110's and PATCH is `_OTHER` (any token is a method: a metric must not grow with them).
/// The attribute this crate records, for instruments of one's own that sit beside them.
///
/// ```
/// let kv = tower_retry_safety::metrics::http_request_method(&http::Method::from_bytes(b"BREW")?);
/// assert_eq!(kv.value.as_str(), "_OTHER");
/// # Ok::<(), http::method::InvalidMethod>(())
/// ```
pub fn http_request_method(method: &Method) -> KeyValue {
    attributes::Method::of(method).attribute()
}
