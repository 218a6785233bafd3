//! Response classification: retry set, the server's retry hint, Retry-After.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, StatusCode};

use super::retry_after::{self, Hint};
use super::statuses::StatusSet;
use super::{Classification, FailureClass, RequestVerdict};

type ResponseHookFn = dyn Fn(StatusCode, &HeaderMap) -> Option<FailureClass> + Send + Sync;

/// The caller's response classifier (see
/// [`classify_responses_with`](crate::RetryPolicyBuilder::classify_responses_with)).
#[derive(Clone)]
pub(crate) struct ResponseHook(pub(crate) Arc<ResponseHookFn>);

impl fmt::Debug for ResponseHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResponseHook(..)")
    }
}

/// What a policy says about responses: which statuses are worth repeating, which prove
/// nothing was applied, the caller's classifier, and the server's hints it reads.
#[derive(Clone, Debug)]
pub(crate) struct ResponseRules {
    pub(crate) retry_statuses: StatusSet,
    pub(crate) not_applied_statuses: StatusSet,
    pub(crate) hook: Option<ResponseHook>,
    /// The longest `Retry-After` waited for; a longer one ends the retries.
    pub(crate) max_retry_after: Duration,
    pub(crate) should_retry_header: Option<HeaderName>,
    pub(crate) stored_response_header: Option<HeaderName>,
}

/// Whether the server marked this response its stored response (read only for a
/// request with a key: no other can be answered with one).
#[inline]
pub(crate) fn is_stored_response(
    policy: &ResponseRules,
    verdict: &RequestVerdict,
    headers: &HeaderMap,
) -> bool {
    match (verdict.has_key(), &policy.stored_response_header) {
        (true, Some(name)) => headers
            .get(name)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true")),
        _ => false,
    }
}

pub(crate) fn classify(
    policy: &ResponseRules,
    verdict: &RequestVerdict,
    status: StatusCode,
    headers: &HeaderMap,
    body_verdict: Option<FailureClass>,
    grpc: bool,
    now: impl FnOnce() -> SystemTime,
) -> Classification {
    // A stored response never changes: repeating the key gets it again. This
    // comes before the caller's classifiers, which read a status that the server will only
    // ever repeat. Only a request with a key can be answered with a stored response: one without is
    // spared the header lookup.
    if is_stored_response(policy, verdict, headers) {
        return Classification::stored_response();
    }
    // The caller's classifiers speak first, the one that read the body before the one that
    // saw the head: they know the API (even a 2xx may be worth repeating).
    let hook = || policy.hook.as_ref()?.0(status, headers);
    if let Some(class) = body_verdict.or_else(hook) {
        return match class {
            FailureClass::Final => FailureClass::Final.into(),
            FailureClass::NotSent => with_hint(policy, FailureClass::NotSent, headers, now),
            // Ambiguous and RetryableResponse: the same row of the table.
            _ => with_hint(policy, FailureClass::RetryableResponse, headers, now),
        };
    }
    // The retry set holds no 2xx and the server's hint is ignored on one: no header to read,
    // but for a gRPC call, whose failures are 200s with a `grpc-status`.
    if status.is_success() {
        if grpc && super::grpc::is_grpc(headers) {
            return super::grpc::classify(verdict, headers, policy.max_retry_after);
        }
        return FailureClass::Final.into();
    }
    if policy.not_applied_statuses.contains(status) {
        return with_hint(policy, FailureClass::NotSent, headers, now);
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
    with_hint(policy, FailureClass::RetryableResponse, headers, now)
}

/// `class` with the server's `Retry-After`; a hint above the policy's cap ends the retries.
fn with_hint(
    policy: &ResponseRules,
    class: FailureClass,
    headers: &HeaderMap,
    now: impl FnOnce() -> SystemTime,
) -> Classification {
    match retry_after::from_headers(headers, now) {
        Hint::After(delay) if delay > policy.max_retry_after => {
            Classification::retry_after_too_long(class, delay)
        }
        Hint::After(delay) => Classification::with_retry_after(class, Some(delay)),
        Hint::None => class.into(),
    }
}
