//! gRPC over HTTP/2 as the decision core reads it, with or without tonic: the failure class of a
//! trailers-only response from its `grpc-status` (gRFC A6 and the gRPC status-code guide),
//! the server's `grpc-retry-pushback-ms`, and the request's `grpc-timeout` and
//! `grpc-previous-rpc-attempts`. Every value a server sends is read without panicking.
//!
//! | `grpc-status` | class | why |
//! |---|---|---|
//! | 0 OK | final | |
//! | 14 UNAVAILABLE | retryable response | transient; the call may have run, so a write is not repeated |
//! | 8 RESOURCE_EXHAUSTED | retryable response | a throttle; a write is not repeated (a quota may be charged after the work) |
//! | 4 DEADLINE_EXCEEDED | retryable response | may have run; a read is repeated only if the deadline leaves time |
//! | 10 ABORTED | retryable response for a keyed call or with pushback, final otherwise | on a key, the server's "original still in flight"; otherwise a conflict to resolve above this call |
//! | any other code, or a malformed one | final | a repeat gets the same answer (UNKNOWN and INTERNAL included) |
//!
//! Response headers that carry messages (no `grpc-status` in them) commit the call: final.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

use super::{Classification, FailureClass, RequestVerdict};

/// The trailer (or, trailers-only, the header) with a call's status code.
pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// A server's pushback: how long to wait before a retry, in milliseconds (gRFC A6).
pub const PUSHBACK: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");
/// The time the caller waits for the call: digits and a unit (gRPC over HTTP/2).
pub const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");
/// How many attempts of the call came before this one (gRFC A6).
pub const PREVIOUS_ATTEMPTS: HeaderName = HeaderName::from_static("grpc-previous-rpc-attempts");

/// The gRPC codes the classification names.
pub(crate) mod code {
    pub(crate) const DEADLINE_EXCEEDED: u32 = 4;
    pub(crate) const RESOURCE_EXHAUSTED: u32 = 8;
    pub(crate) const ABORTED: u32 = 10;
    pub(crate) const UNAVAILABLE: u32 = 14;
}

/// Whether `headers` are a gRPC message's (`content-type: application/grpc`, `+proto`…).
#[inline]
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// A proto name: a letter or `_`, then letters, digits and `_`.
pub(crate) fn is_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A proto package: names joined by dots, or none.
pub(crate) fn is_full_name(package: &str) -> bool {
    package.is_empty() || package.split('.').all(is_name)
}

/// `pkg.Service/Method` from a call's path `/pkg.Service/Method`, if it has that shape: a
/// bounded name for a metric's attribute, never an arbitrary path.
pub(crate) fn method_name(path: &str) -> Option<&str> {
    let name = path.strip_prefix('/')?;
    let (service, method) = name.split_once('/')?;
    let (package, service) = service.rsplit_once('.').unwrap_or(("", service));
    (is_full_name(package) && is_name(service) && is_name(method)).then_some(name)
}

/// Whether a request is a gRPC call: a POST (gRPC over HTTP/2 sends nothing else) with a
/// gRPC content type. The client's layer and the server's read a request alike through it.
/// (The client's layer reads it in the same pass as its other headers, `attempts::plan`.)
#[inline]
pub fn is_call(method: &http::Method, headers: &HeaderMap) -> bool {
    method == http::Method::POST && is_grpc(headers)
}

/// Whether `headers` end a gRPC call by themselves: a trailers-only response.
#[inline]
pub fn is_trailers_only(headers: &HeaderMap) -> bool {
    headers.contains_key(GRPC_STATUS) && is_grpc(headers)
}

/// The server's pushback: what `grpc-retry-pushback-ms` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pushback {
    /// No header: the backoff applies.
    None,
    /// Retry after this long.
    After(Duration),
    /// Negative or unreadable: gRFC A6 reads it as "do not retry".
    DoNotRetry,
}

pub(crate) fn pushback(headers: &HeaderMap) -> Pushback {
    let Some(value) = headers.get(PUSHBACK) else {
        return Pushback::None;
    };
    let text = value.to_str().unwrap_or("").trim();
    match text.parse::<i64>() {
        // Saturates: a huge value exceeds any cap and ends the retries as too long.
        Ok(ms) if ms >= 0 => Pushback::After(Duration::from_millis(ms.unsigned_abs())),
        _ => Pushback::DoNotRetry,
    }
}

/// The code in a `grpc-status` value: 1 to 3 ASCII digits, or `None` when malformed.
pub fn status_code(value: &HeaderValue) -> Option<u32> {
    let bytes = value.as_bytes();
    if bytes.is_empty() || bytes.len() > 3 || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(bytes.iter().fold(0, |n, b| n * 10 + u32::from(b - b'0')))
}

/// The class of an HTTP 2xx response whose headers say it is gRPC. `max_pushback` is the
/// policy's cap on a server's wait (`max_retry_after`).
pub(crate) fn classify(
    verdict: &RequestVerdict,
    headers: &HeaderMap,
    max_pushback: Duration,
) -> Classification {
    // Headers without a status are followed by messages: the call is committed (A6).
    let Some(value) = headers.get(GRPC_STATUS) else {
        return FailureClass::Final.into();
    };
    let retryable = match status_code(value) {
        Some(code::UNAVAILABLE | code::RESOURCE_EXHAUSTED | code::DEADLINE_EXCEEDED) => true,
        Some(code::ABORTED) => verdict.is_keyed() || headers.contains_key(PUSHBACK),
        // OK, the final codes, and a status that cannot be read (taken as UNKNOWN).
        _ => false,
    };
    if !retryable {
        return FailureClass::Final.into();
    }
    match pushback(headers) {
        Pushback::None => FailureClass::RetryableResponse.into(),
        Pushback::DoNotRetry => FailureClass::Final.into(),
        Pushback::After(delay) if delay > max_pushback => {
            Classification::retry_after_too_long(FailureClass::RetryableResponse, delay)
        }
        Pushback::After(delay) => {
            Classification::with_retry_after(FailureClass::RetryableResponse, Some(delay))
        }
    }
}

/// A `grpc-timeout` value: at most 8 digits and a unit (gRPC over HTTP/2). The finest unit
/// that holds the duration, so nothing is rounded away until hours.
pub(crate) fn encode_timeout(left: Duration) -> HeaderValue {
    const MAX: u128 = 99_999_999;
    let nanos = left.as_nanos();
    let units: [(u128, &str); 6] = [
        (1, "n"),
        (1_000, "u"),
        (1_000_000, "m"),
        (1_000_000_000, "S"),
        (60_000_000_000, "M"),
        (3_600_000_000_000, "H"),
    ];
    for (per, unit) in units {
        let value = nanos / per;
        if value <= MAX {
            return HeaderValue::from_str(&format!("{value}{unit}"))
                .unwrap_or(HeaderValue::from_static("99999999H"));
        }
    }
    HeaderValue::from_static("99999999H")
}

/// A `grpc-timeout` the caller set (tonic's `Request::set_timeout`), or `None` if malformed.
pub(crate) fn parse_timeout(value: &HeaderValue) -> Option<Duration> {
    let bytes = value.as_bytes();
    let (unit, digits) = bytes.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |n, b| n * 10 + u64::from(b - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Metadata of a failed call's status: the attempts made.
pub(crate) const ATTEMPTS: HeaderName = HeaderName::from_static("retry-safety-attempts");
/// Metadata of a failed call's status: whether it may have been applied (`true`, `false`).
pub(crate) const MAY_HAVE_BEEN_APPLIED: HeaderName =
    HeaderName::from_static("retry-safety-may-have-been-applied");

/// Puts the report's gist in a trailers-only failure's headers, which tonic turns into its
/// `Status`'s metadata (the response's extensions, and so the report, do not reach it): a
/// caller's own retry loop can tell a suppressed write from a call that never ran. Called for
/// a gRPC call's response whatever its `content-type`: tonic makes its `Status` from a failed
/// `grpc-status` in the headers without looking at it, so a server's own
/// `retry-safety-may-have-been-applied` must never reach the caller.
pub(crate) fn mark_status(headers: &mut HeaderMap, attempts: u32, may_have_been_applied: bool) {
    let failed = headers
        .get(GRPC_STATUS)
        .is_some_and(|v| v.as_bytes() != b"0");
    if !failed {
        return;
    }
    headers.insert(ATTEMPTS, HeaderValue::from(attempts));
    let applied = if may_have_been_applied {
        "true"
    } else {
        "false"
    };
    headers.insert(MAY_HAVE_BEEN_APPLIED, HeaderValue::from_static(applied));
    headers.insert(MARK, process_mark().clone());
}

/// Metadata of a failed call's status: this process's mark, put beside the layer's answer.
/// A server can send `retry-safety-may-have-been-applied` itself (in trailers after messages,
/// which the layer never sees); it cannot send this process's mark, so its claim is not
/// believed (see `MayHaveBeenApplied for tonic::Status`).
pub(crate) const MARK: HeaderName = HeaderName::from_static("retry-safety-mark");

/// A random value made once per process: what [`MARK`] carries.
pub(crate) fn process_mark() -> &'static HeaderValue {
    static MARK_VALUE: std::sync::OnceLock<HeaderValue> = std::sync::OnceLock::new();
    MARK_VALUE.get_or_init(|| {
        let mut text = [0u8; uuid::fmt::Simple::LENGTH];
        uuid::Uuid::new_v4().simple().encode_lower(&mut text);
        // Hex digits: always a valid header value.
        HeaderValue::from_bytes(&text).unwrap_or(HeaderValue::from_static("unmarked"))
    })
}

/// Writes what a gRPC server reads about this attempt: the time left as its `grpc-timeout`,
/// and, on a retry, how many attempts came before (A6's `grpc-previous-rpc-attempts`).
pub(crate) fn mark_attempt(headers: &mut HeaderMap, number: u32, time_left: Option<Duration>) {
    if let Some(left) = time_left {
        headers.insert(GRPC_TIMEOUT, encode_timeout(left));
    }
    if number > 1 {
        headers.insert(PREVIOUS_ATTEMPTS, HeaderValue::from(number - 1));
    }
}

#[cfg(test)]
#[path = "grpc_tests.rs"]
mod tests;
