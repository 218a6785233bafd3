//! Response classification: retry set, the server's retry hint, Retry-After.

use std::time::SystemTime;

use http::{HeaderMap, StatusCode};

use super::retry_after::{self, Hint};
use super::{Classification, FailureClass, RequestVerdict};
use crate::policy::Inner;

pub(crate) fn classify(
    policy: &Inner,
    verdict: &RequestVerdict,
    status: StatusCode,
    headers: &HeaderMap,
    now: impl FnOnce() -> SystemTime,
) -> Classification {
    // The retry set holds no 2xx and the server's hint is ignored on one: no header to read.
    if status.is_success() {
        return FailureClass::Final.into();
    }
    let hint = policy
        .should_retry_header
        .as_ref()
        .and_then(|name| headers.get(name))
        .map(|v| v.as_bytes());
    let retryable = match hint {
        Some(b"false") => false,
        Some(b"true") => !status.is_success() && !status.is_informational(),
        // A keyed request whose original is still in flight: try the same key again later.
        _ if status == StatusCode::CONFLICT && verdict.is_keyed() => true,
        _ => policy.retry_statuses.contains(status),
    };
    if !retryable {
        return FailureClass::Final.into();
    }
    match retry_after::from_headers(headers, now) {
        Hint::After(delay) if delay > policy.max_retry_after => {
            Classification::retry_after_too_long(delay)
        }
        Hint::After(delay) => {
            Classification::with_retry_after(FailureClass::RetryableResponse, Some(delay))
        }
        Hint::None => FailureClass::RetryableResponse.into(),
    }
}
