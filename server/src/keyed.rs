//! What a keyed request brings to its claim, in every mode: its body read whole (within the
//! limit), its key scoped to its client, and its fingerprint.

use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response, StatusCode};
use http_body::Body;

use super::buffer::{read_body, ReadError};
use super::layer::Config;
use super::outcome::reply;
use super::store::Fingerprint;
use super::ResponseBody;

use tower_retry_safety::BoxError;

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
    pub(crate) fn outcome(self) -> super::observe::KeyedOutcome {
        match self {
            BadKey::Missing => super::observe::KeyedOutcome::MissingKey,
            BadKey::Malformed => super::observe::KeyedOutcome::MalformedKey,
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
