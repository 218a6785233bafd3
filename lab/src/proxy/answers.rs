//! The answers the proxy gives itself, not the upstream's: a short text, and the one to a
//! request that arrives once it stopped.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::Full;

/// `status` with `message` as its body.
pub(super) fn text(status: StatusCode, message: &'static str) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(Bytes::from_static(message.as_bytes())));
    *res.status_mut() = status;
    res
}

/// The answer to a request that arrives once the proxy stopped: not counted, not sent.
pub(super) fn stopping() -> Response<Full<Bytes>> {
    let mut res = text(
        StatusCode::SERVICE_UNAVAILABLE,
        "the fault lab is stopping: this request was not forwarded\n",
    );
    res.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    res
}
