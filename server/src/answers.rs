//! The layer's own answers (409, 422, 503, 504: each text written here once), and the entries
//! it keeps when it cannot keep a handler's response whole. Once a handler has been called its
//! key is never freed, so every ending has a stored response to send.

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use crate::body::ResponseBody;
use crate::store::StoredResponse;

/// Set on a stored response whose body was not kept (too large, data after its trailers, or it failed while
/// being read): the status and headers are the handler's, the body is empty.
pub(crate) const BODY_OMITTED: HeaderName = HeaderName::from_static("idempotent-replay-body");

/// The hint our client (and Stainless-style SDKs) read: repeating this key only gets the
/// same entry, so there is nothing to gain from retrying it.
pub(crate) const SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");

const UNKNOWN: &str = "the first request with this Idempotency-Key was handed to its handler, \
which ended without a response (it failed, timed out or panicked); it may have applied its \
effect, so it is not run again for this key. Check the resource's state before sending the \
request again with a new key.";

/// The handler was called and ended without a response: whether it applied is unknown.
pub(crate) fn unknown() -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(SHOULD_RETRY, HeaderValue::from_static("false"));
    StoredResponse::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        headers,
        Bytes::from_static(UNKNOWN.as_bytes()),
    )
}

/// The handler answered, but its body cannot be kept: keep what it said (status, headers)
/// and say that the body is missing.
pub(crate) fn head_only(status: StatusCode, headers: &HeaderMap) -> StoredResponse {
    let mut headers = headers.clone();
    // They described the body that is not sent again.
    for name in [
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        header::CONTENT_ENCODING,
        header::TRAILER,
    ] {
        headers.remove(name);
    }
    headers.insert(BODY_OMITTED, HeaderValue::from_static("omitted"));
    headers.insert(SHOULD_RETRY, HeaderValue::from_static("false"));
    StoredResponse::new(status, headers, Bytes::new())
}

pub(crate) fn reply<B>(status: StatusCode, message: &'static str) -> Response<ResponseBody<B>> {
    let mut res = Response::new(ResponseBody::full(Bytes::from_static(message.as_bytes())));
    *res.status_mut() = status;
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    res
}

/// Marks the layer's answer to a keyed request whose caller's deadline had passed before its
/// handler could be called (a gRPC call reads it as `DEADLINE_EXCEEDED`).
pub(crate) const CALLER_GONE: http::HeaderName =
    http::HeaderName::from_static("x-deadline-exceeded");

/// The answer to a keyed request whose caller's deadline had passed before its handler could
/// be called: 504; its key was freed.
pub(crate) fn caller_gone<B>() -> Response<ResponseBody<B>> {
    let mut res = reply(
        StatusCode::GATEWAY_TIMEOUT,
        "the caller's deadline had passed: nothing was run, and the key is free",
    );
    res.headers_mut()
        .insert(CALLER_GONE, HeaderValue::from_static("nothing was run"));
    res
}

pub(crate) fn retry_later<B>(
    status: StatusCode,
    message: &'static str,
) -> Response<ResponseBody<B>> {
    let mut res = reply(status, message);
    res.headers_mut()
        .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
    res
}

/// A stored entry as a response.
pub(crate) fn stored_response<B>(stored: &StoredResponse) -> Response<ResponseBody<B>> {
    let mut res = Response::new(ResponseBody::full_with_trailers(
        stored.body().clone(),
        stored.trailers().cloned(),
    ));
    *res.status_mut() = stored.status();
    *res.headers_mut() = stored.headers().clone();
    res
}

/// Whether a handler's answer is a server error: a 5xx, or a gRPC call's trailers-only status
/// that maps to one (UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE,
/// DATA_LOSS, as gRPC's HTTP mapping has them), which a gRPC server answers with a 200.
pub(crate) fn is_server_error(status: StatusCode, headers: &HeaderMap) -> bool {
    if status.is_server_error() {
        return true;
    }
    // A gRPC server's trailers-only answer says so in its content type: a 200 of any other
    // handler is a success whatever headers it carries.
    if status.is_success()
        && tower_retry_safety::wire::grpc::is_grpc(headers)
        && tower_retry_safety::wire::grpc::is_trailers_only(headers)
    {
        let code = headers
            .get("grpc-status")
            .and_then(tower_retry_safety::wire::grpc::status_code);
        return matches!(code, Some(2 | 4 | 12 | 13 | 14 | 15));
    }
    false
}

/// 409: a request with this key is running (here, on another server, or in another
/// transaction).
pub(crate) fn in_progress<B>() -> Response<ResponseBody<B>> {
    retry_later(
        StatusCode::CONFLICT,
        "a request with this Idempotency-Key is still in progress; retry later",
    )
}

/// 422: the key was used with a different request.
pub(crate) fn mismatch<B>() -> Response<ResponseBody<B>> {
    reply(
        StatusCode::UNPROCESSABLE_ENTITY,
        "this Idempotency-Key was already used with a different request",
    )
}

/// 503: the store cannot track the key (it failed, or refused the claim); nothing was run.
pub(crate) fn cannot_track<B>() -> Response<ResponseBody<B>> {
    retry_later(
        StatusCode::SERVICE_UNAVAILABLE,
        "the server cannot track this Idempotency-Key right now; nothing was applied, retry later",
    )
}
