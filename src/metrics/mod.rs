//! OpenTelemetry metrics for both halves (feature `opentelemetry`): what the client's retries
//! did, and what the server layer answered to keyed requests.
#![doc = include_str!("../docs/metrics.md")]

pub(crate) mod client;

use http::Method;
use opentelemetry::KeyValue;

/// `http.request.method`, bounded as OpenTelemetry's HTTP conventions ask: a method outside
/// RFC 9110's and PATCH is `_OTHER` (any token is a method: a metric must not grow with them).
pub(crate) fn method(method: &Method) -> KeyValue {
    let name = match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::CONNECT => "CONNECT",
        Method::OPTIONS => "OPTIONS",
        Method::TRACE => "TRACE",
        Method::PATCH => "PATCH",
        _ => "_OTHER",
    };
    KeyValue::new("http.request.method", name)
}
