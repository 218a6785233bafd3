//! What the layer offers each of its modes, lease mode (`service.rs`, `run.rs`) and atomic
//! mode (`postgres/atomic/`), and all that atomic mode takes from it: the layer's settings
//! ([`Config`]), the body a handler gets ([`InnerBody`]), a keyed request read for its claim
//! (its key, its body within the limit, its scope and its fingerprint), the answer to a key
//! already taken, and the entry of a response read whole.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{Either, Full};

use crate::answers::{self, reply};
use crate::body::ResponseBody;
use crate::buffer::{read_body, ReadError};
use crate::observe::{KeyHandling, Observe};
use crate::store::{Entry, Fingerprint, StoredResponse};

use tower_retry_safety::BoxError;

/// The request body a handler gets: the body the layer read (`Left`, a keyed request), or
/// the request's own (`Right`).
pub(crate) type InnerBody<B> = Either<Full<Bytes>, B>;

/// The layer's settings, shared by every service it makes and by both modes.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) key_header: HeaderName,
    pub(crate) stored_response_header: HeaderName,
    pub(crate) ttl: Duration,
    pub(crate) lease: Duration,
    pub(crate) store_server_errors: bool,
    pub(crate) scope: Option<Scope>,
    pub(crate) max_request_bytes: usize,
    pub(crate) max_response_bytes: usize,
    pub(crate) required: Vec<Method>,
    /// The instruments keyed requests are counted in, if the layer was given a meter.
    pub(crate) observe: Observe,
}

type ScopeFn = dyn Fn(&http::request::Parts) -> Option<String> + Send + Sync;

/// Reads the scope of a request's key.
#[derive(Clone)]
pub(crate) struct Scope(pub(crate) Arc<ScopeFn>);

impl std::fmt::Debug for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Scope(..)")
    }
}

/// A request whose key header cannot be used: it gets 400, and nothing runs.
#[derive(Clone, Copy, Debug)]
pub(crate) enum BadKey {
    /// The method needs a key, and the request has none.
    Missing,
    /// The key is not a well-formed key.
    Malformed,
}

impl BadKey {
    /// How the layer's instruments count it.
    pub(crate) fn handling(self) -> KeyHandling {
        match self {
            BadKey::Missing => KeyHandling::MissingKey,
            BadKey::Malformed => KeyHandling::MalformedKey,
        }
    }

    /// The answer to the request.
    #[cold]
    pub(crate) fn reply<R>(self) -> Response<ResponseBody<R>> {
        reply(
            StatusCode::BAD_REQUEST,
            match self {
                BadKey::Missing => {
                    "this request needs an Idempotency-Key header: a quoted string, such as \
                     \"8e03978e-40d5-43e8-bc93-6894a57f9324\""
                }
                BadKey::Malformed => {
                    "malformed Idempotency-Key: expected a quoted string (RFC 8941 sf-string) of \
                     printable ASCII, or a bare token of visible ASCII without quotes or \
                     backslashes; non-empty, at most 255 bytes"
                }
            },
        )
    }
}

/// The request's idempotency key, if it has one (`None`: it passes through), or why it cannot
/// be used.
#[inline]
pub(crate) fn key_of<B>(config: &Config, req: &Request<B>) -> Result<Option<Arc<str>>, BadKey> {
    let Some(value) = req.headers().get(&config.key_header) else {
        if config.required.contains(req.method()) {
            return Err(BadKey::Missing);
        }
        return Ok(None);
    };
    match tower_retry_safety::wire::idempotency_key(value) {
        Some(key) => Ok(Some(key.into())),
        None => Err(BadKey::Malformed),
    }
}

/// A keyed request ready to claim its key.
pub(crate) struct Keyed {
    pub(crate) body: Bytes,
    /// The key as stored: the client's, after its scope's hash if keys are scoped.
    pub(crate) key: Arc<str>,
    pub(crate) fingerprint: Fingerprint,
}

/// Reads the body of a request with the key `shown` and scopes its key; or the answer (400,
/// 413) to a request that cannot be claimed. Nothing has run either way.
pub(crate) async fn prepare<B, R>(
    config: &Config,
    shown: &Arc<str>,
    parts: &Parts,
    body: B,
) -> Result<Keyed, Response<ResponseBody<R>>>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let body = match read_body(body, config.max_request_bytes).await {
        Ok(body) => body,
        Err(ReadError::TooLarge) => {
            return Err(reply(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the request body is larger than this server keeps for idempotency keys",
            ))
        }
        Err(ReadError::Failed) => {
            return Err(reply(
                StatusCode::BAD_REQUEST,
                "the request body could not be read",
            ))
        }
    };
    let key: Arc<str> = match &config.scope {
        None => shown.clone(),
        Some(scope) => match (scope.0)(parts) {
            Some(scope) => scoped_key(&scope, shown).into(),
            None => {
                return Err(reply(
                    StatusCode::BAD_REQUEST,
                    "this server scopes Idempotency-Keys by client, and the request does not say which client sent it",
                ))
            }
        },
    };
    let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let fingerprint = Fingerprint::of(&parts.method, target, &body);
    Ok(Keyed {
        body,
        key,
        fingerprint,
    })
}

/// The stored key of a scoped request: a hash of the scope (which may be a secret, such as an
/// API key: it never reaches a store's key names or a log in clear), then the client's key.
pub(crate) fn scoped_key(scope: &str, key: &str) -> String {
    use sha2::{Digest, Sha256};
    use std::fmt::Write;
    let digest = Sha256::digest(scope.as_bytes());
    let mut out = String::with_capacity(33 + key.len());
    // 128 bits of the hash: collisions between scopes are out of reach.
    for b in &digest[..16] {
        let _ = write!(out, "{b:02x}");
    }
    out.push('|');
    out.push_str(key);
    out
}

/// The answer to a request whose key an `entry` holds (`fingerprint` is the request's): its
/// stored response, 409 while the first runs, 422 for another request under the key.
pub(crate) fn taken<B>(
    entry: Entry,
    fingerprint: Fingerprint,
    config: &Config,
) -> (KeyHandling, Response<ResponseBody<B>>) {
    match entry {
        Entry::InFlight { fingerprint: first } if first == fingerprint => {
            (KeyHandling::InFlight, answers::in_progress())
        }
        Entry::Completed {
            fingerprint: first,
            response,
        } if first == fingerprint => (KeyHandling::StoredResponse, send_stored(response, config)),
        _ => (KeyHandling::Mismatch, answers::mismatch()),
    }
}

/// A stored response sent again to a repeat, marked so.
pub(crate) fn send_stored<B>(stored: StoredResponse, config: &Config) -> Response<ResponseBody<B>> {
    let mut res = answers::stored_response(&stored);
    let server_error = answers::is_server_error(res.status(), res.headers());
    let headers = res.headers_mut();
    headers.insert(
        config.stored_response_header.clone(),
        HeaderValue::from_static("true"),
    );
    // A stored 5xx is sent again to every repeat of the key: a client that retries on 5xx
    // would spend its retries on the same answer. The handler ran; say there is nothing to
    // gain (any hint the handler gave is replaced).
    if server_error {
        headers.insert(answers::SHOULD_RETRY, HeaderValue::from_static("false"));
    }
    res
}

/// The entry of a response read whole, with its trailers.
pub(crate) fn whole(
    parts: &http::response::Parts,
    bytes: &Bytes,
    trailers: Option<&HeaderMap>,
) -> StoredResponse {
    let stored = StoredResponse::new(parts.status, parts.headers.clone(), bytes.clone());
    match trailers {
        Some(trailers) => stored.with_trailers(trailers.clone()),
        None => stored,
    }
}
