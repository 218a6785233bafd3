//! Handing an attempt to the upstream and reading its answer whole, counting it as it goes.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Method, Request, Response, StatusCode, Version};
use http_body::Body as _;
use http_body_util::{BodyExt, Full, Limited};

use super::answers::{stopping, text};
use super::shared::Shared;
use crate::ledger::{Attempt, Sent};

/// Headers of one hop, never forwarded (RFC 9110 §7.6.1), and `host`, which the proxy's
/// client sets for the upstream.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::HOST,
];

/// Whether the upstream may have run the request: yes unless its answer says otherwise: a
/// stored response (the replayed header), a refused keyed request (400 malformed, 409 in
/// flight, 422 another payload), or a 429 (RFC 6585 §4: the request was refused for its
/// rate, not processed). A 503, even with `Retry-After`, counts as applied: RFC 9110 does not
/// say a 503 ran nothing, and a handler that failed half-way often answers one.
fn applied(res: &Response<Full<Bytes>>, keyed: bool, stored_header: &HeaderName) -> bool {
    let stored = res
        .headers()
        .get(stored_header)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
    let status = res.status().as_u16();
    let refused = keyed && matches!(status, 400 | 409 | 422);
    let rate_limited = status == 429;
    !stored && !refused && !rate_limited
}

/// Copies the end-to-end headers: not the hop-by-hop ones, nor those the `Connection`
/// header names for this hop (RFC 9110 §7.6.1).
fn copy_headers(from: &HeaderMap, to: &mut HeaderMap) {
    let named: Vec<String> = from
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|token| token.trim().to_ascii_lowercase())
        .filter(|token| !token.is_empty())
        .collect();
    for (name, value) in from {
        if !HOP_BY_HOP.contains(name) && !named.iter().any(|n| n == name.as_str()) {
            to.append(name.clone(), value.clone());
        }
    }
}

/// Sends the request upstream and reads its answer whole, counting the attempt as it goes:
/// handed to the upstream client, it may have applied; only a connect error proves it was
/// not sent, and only a whole answer can say it ran nothing. `Err` is the proxy's own answer
/// when forwarding failed (502), or when the proxy stopped before it was sent (503).
pub(super) async fn forward(
    shared: &Shared,
    attempt: &Attempt,
    parts: &Parts,
    path_and_query: &str,
    body: Bytes,
) -> Result<Response<Full<Bytes>>, Response<Full<Bytes>>> {
    let config = &shared.config;
    let bad_gateway = |message: &'static str| text(StatusCode::BAD_GATEWAY, message);
    let Some(uri) = config.target(path_and_query) else {
        return Err(bad_gateway(
            "the fault lab cannot forward this request target\n",
        ));
    };
    let mut req = Request::new(Full::new(body));
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = uri;
    // The client may speak HTTP/2 to the proxy; the upstream is spoken to in HTTP/1.1.
    *req.version_mut() = Version::HTTP_11;
    copy_headers(&parts.headers, req.headers_mut());
    // The body is whole: its length is known. An HTTP/2 client sends no content-length for an
    // empty body, and an HTTP/1.1 POST, PUT or PATCH without one is refused by some servers.
    let length = req.body().size_hint().exact().unwrap_or(0);
    if length > 0 || matches!(parts.method, Method::POST | Method::PUT | Method::PATCH) {
        req.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    let keyed = parts.headers.contains_key(config.identity.key_header());
    if !shared.ledger.sending(attempt) {
        return Err(stopping());
    }
    let res = match shared.client.request(req).await {
        Ok(res) => res,
        Err(err) => {
            let how = if err.is_connect() {
                Sent::ConnectFailed
            } else {
                Sent::NoAnswer
            };
            shared.ledger.sent(attempt, how);
            if !shared.reported.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "retry-safety-lab: the upstream {} failed a request: {err} (502 to the client; reported once)",
                    config.upstream_display
                );
            }
            return Err(bad_gateway("the fault lab could not reach the upstream\n"));
        }
    };
    let (head, body) = res.into_parts();
    let body = match Limited::new(body, config.max_body).collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => {
            shared.ledger.sent(attempt, Sent::NoAnswer);
            return Err(bad_gateway(
                "the upstream's answer broke off or is longer than the fault lab's --max-body\n",
            ));
        }
    };
    let mut res = Response::new(Full::new(body));
    *res.status_mut() = head.status;
    copy_headers(&head.headers, res.headers_mut());
    let applied = applied(&res, keyed, &config.stored_response_header);
    shared.ledger.sent(attempt, Sent::Answered { applied });
    Ok(res)
}
