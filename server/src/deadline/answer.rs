//! The layer's own answer: a request whose caller had gone before anything ran.

use http::{header, HeaderValue, Response, StatusCode};

/// In the extensions of the layer's own answer: the inner service was not called. The
/// idempotency layer, placed outside this one, frees the key on seeing it rather than store
/// the answer (the handler provably did not run). Crate-private, so no handler can forge it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NothingRan;

/// The answer to a request whose caller's deadline had passed before anything ran: `504`,
/// or for a gRPC call a trailers-only `DEADLINE_EXCEEDED`.
pub(crate) fn caller_gone(grpc: bool) -> Response<()> {
    let mut res = Response::new(());
    res.extensions_mut().insert(NothingRan);
    if !grpc {
        *res.status_mut() = StatusCode::GATEWAY_TIMEOUT;
    }
    let headers = res.headers_mut();
    if grpc {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert("grpc-status", HeaderValue::from(4));
        headers.insert(
            "grpc-message",
            HeaderValue::from_static("the caller's deadline had passed: nothing was run"),
        );
    } else {
        headers.insert(
            crate::answers::CALLER_GONE,
            HeaderValue::from_static("the caller's deadline had passed: nothing was run"),
        );
    }
    res
}
