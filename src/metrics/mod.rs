//! OpenTelemetry metrics for both halves (feature `opentelemetry`): what the client's retries
//! did, and what the server layer answered to keyed requests.
#![doc = include_str!("../docs/metrics.md")]

mod attributes;
pub(crate) mod client;

use http::Method;
use opentelemetry::KeyValue;

/// `http.request.method`, bounded as OpenTelemetry's HTTP conventions ask: a method outside
/// RFC 9110's and PATCH is `_OTHER` (any token is a method: a metric must not grow with them).
#[cfg_attr(not(feature = "server"), allow(dead_code))]
pub(crate) fn method(method: &Method) -> KeyValue {
    attributes::Method::of(method).attribute()
}
