//! The layer's own answers: a request whose caller has gone, and the note on a deadline
//! header that was capped or ignored.

use bytes::Bytes;
use http::{header, HeaderName, HeaderValue, Response, StatusCode};

/// The body of the layer's own answers.
pub(crate) type Empty = http_body_util::Empty<Bytes>;

/// The answer's header that says what became of the request's deadline header, when it was
/// not used as sent: `capped` (over the server's maximum), `ignored-malformed`,
/// `ignored-too-long` (the server's maximum applied instead).
pub const DEADLINE_NOTE: HeaderName = HeaderName::from_static("request-timeout-note");

/// What became of the deadline header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Note {
    Capped,
    Malformed,
    TooLong,
}

impl Note {
    fn value(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            Note::Capped => "capped",
            Note::Malformed => "ignored-malformed",
            Note::TooLong => "ignored-too-long",
        })
    }

    /// Writes the note on `res`.
    pub(crate) fn mark<B>(note: Option<Note>, res: &mut Response<B>) {
        if let Some(note) = note {
            res.headers_mut().insert(DEADLINE_NOTE, note.value());
        }
    }
}

/// The answer to a request whose caller's deadline had passed before anything ran: `504`,
/// or for a gRPC call a trailers-only `DEADLINE_EXCEEDED`.
pub(crate) fn caller_gone(grpc: bool) -> Response<Empty> {
    let mut res = Response::new(Empty::new());
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
            crate::outcome::CALLER_GONE,
            HeaderValue::from_static("the caller's deadline had passed: nothing was run"),
        );
    }
    res
}
