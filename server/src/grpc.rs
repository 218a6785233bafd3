//! The layer's own answers to a gRPC call (with or without tonic), as a gRPC client reads them: a
//! trailers-only response whose `grpc-status` says what the HTTP status said.
//!
//! | the layer's answer | `grpc-status` | why |
//! |---|---|---|
//! | 409, the first call with the key is in flight | `ABORTED`, with `grpc-retry-pushback-ms` | the status-code guide's "retry at a higher level"; `tower-retry-safety`'s client retries a keyed call on it, after the pushback |
//! | 422, the key was used with another call | `INVALID_ARGUMENT` | the call is wrong for this key whatever the server's state: `FAILED_PRECONDITION` would say a later repeat could work |
//! | 400, a missing or malformed key | `INVALID_ARGUMENT` | |
//! | 413, a body over the layer's limit | `RESOURCE_EXHAUSTED` | what gRPC answers a message over its size limit |
//! | 503, the store cannot track the key (nothing ran) | `UNAVAILABLE`, with pushback | |
//! | 500, the stored "outcome unknown" entry | `UNKNOWN` | the handler may have applied; a client must not repeat it |
//! | a stored response whose body was too large to keep (`idempotent-replay-body`) | `UNKNOWN` | the handler ran; its message and status are gone |

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};

use crate::answers::{BODY_OMITTED, CALLER_GONE};
use crate::body::ResponseBody;
use tower_retry_safety::wire::grpc::{GRPC_STATUS, PUSHBACK};
use tower_retry_safety::wire::parse_retry_after;

/// `res` for a gRPC call: unchanged if it is one already (a success, or a `grpc-status`).
pub(crate) fn answer<B>(res: Response<ResponseBody<B>>) -> Response<ResponseBody<B>> {
    // A stored response not kept whole has no message and no status left to give.
    let omitted = res.headers().contains_key(BODY_OMITTED);
    if res.headers().contains_key(GRPC_STATUS) || (res.status().is_success() && !omitted) {
        return res;
    }
    let (code, message): (u16, &str) = match res.status().as_u16() {
        _ if omitted => (
            2,
            "the first call with this idempotency-key ran, and its answer was too large to keep whole; check its effect before calling again with a new key",
        ),
        504 if res.headers().contains_key(CALLER_GONE) => (
            4,
            "the caller's deadline had passed: nothing was run, and the idempotency-key is free",
        ),
        400 => (3, "missing or malformed idempotency-key metadata"),
        409 => (
            10,
            "a call with this idempotency-key is still in progress; retry later with the same key",
        ),
        413 => (8, "the call is over the size the server keeps for an idempotency-key"),
        422 => (3, "this idempotency-key was already used with a different call"),
        500 => (
            2,
            "the first call with this idempotency-key may have been applied, and is not run again; check its effect before calling again with a new key",
        ),
        503 => (
            14,
            "the server cannot track this idempotency-key right now; nothing was applied, retry later",
        ),
        401 => (16, "unauthenticated"),
        403 => (7, "permission denied"),
        404 => (12, "not found"),
        429 | 502 | 504 => (14, "unavailable"),
        _ => (2, "the server answered this call with an HTTP error"),
    };
    let (mut parts, _) = res.into_parts();
    let pushback = parts
        .headers
        .get(header::RETRY_AFTER)
        .and_then(|v| parse_retry_after(v, std::time::SystemTime::now));
    for name in [
        header::CONTENT_TYPE,
        header::CONTENT_LENGTH,
        header::RETRY_AFTER,
    ] {
        parts.headers.remove(name);
    }
    let headers = &mut parts.headers;
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(GRPC_STATUS, HeaderValue::from(code));
    // Printable ASCII without `%`: no percent-encoding needed.
    if let Ok(message) = HeaderValue::from_str(message) {
        headers.insert("grpc-message", message);
    }
    if let Some(after) = pushback {
        let ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
        headers.insert(PUSHBACK, HeaderValue::from(ms));
    }
    parts.status = StatusCode::OK;
    Response::from_parts(parts, ResponseBody::full(Bytes::new()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_retry_safety::wire::grpc::status_code;

    fn answer_to(
        status: u16,
        retry_after: Option<&'static str>,
    ) -> Response<ResponseBody<http_body_util::Empty<Bytes>>> {
        let mut res = Response::new(ResponseBody::<http_body_util::Empty<Bytes>>::full("text"));
        *res.status_mut() = StatusCode::from_u16(status).unwrap();
        res.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        if let Some(after) = retry_after {
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static(after));
        }
        answer(res)
    }

    #[test]
    fn each_answer_is_a_trailers_only_status() {
        for (http, code) in [
            (400, 3),
            (409, 10),
            (413, 8),
            (422, 3),
            (500, 2),
            (503, 14),
            (418, 2),
        ] {
            let res = answer_to(http, None);
            assert_eq!(res.status(), StatusCode::OK);
            assert_eq!(res.headers()[header::CONTENT_TYPE], "application/grpc");
            assert_eq!(
                status_code(&res.headers()[GRPC_STATUS]),
                Some(code),
                "{http}"
            );
            assert!(res.headers().contains_key("grpc-message"));
            assert!(http_body::Body::is_end_stream(res.body()));
        }
        let res = answer_to(409, Some("1"));
        assert_eq!(res.headers()[PUSHBACK], "1000");
        assert!(!res.headers().contains_key(header::RETRY_AFTER));
    }

    #[test]
    fn a_grpc_response_is_left_alone() {
        let mut res = Response::new(ResponseBody::<http_body_util::Empty<Bytes>>::full(""));
        res.headers_mut()
            .insert(GRPC_STATUS, HeaderValue::from_static("14"));
        *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        let res = answer(res);
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        let ok = answer(Response::new(
            ResponseBody::<http_body_util::Empty<Bytes>>::full(""),
        ));
        assert!(!ok.headers().contains_key(GRPC_STATUS));
    }
}
