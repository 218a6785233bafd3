use std::future::{ready, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Either, Full};
use tower_service::Service;

use super::derive::RequestKey;
use super::layer::Config;
use super::run::{self, Claimed};
use super::store::{Begin, Entry, Fingerprint, IdempotencyStore, StoredResponse};
use super::ResponseBody;
use crate::classify::idempotency_key;
use crate::BoxError;

/// The service of [`IdempotencyLayer`](super::IdempotencyLayer).
///
/// The inner service receives `Request<Either<Full<Bytes>, B>>`: the buffered body (`Left`) for
/// a keyed request, whose body was read for its fingerprint, and the untouched body (`Right`)
/// for any other request. axum's `Router` and any service generic over its body accept it.
/// The response body must be `Unpin` (hyper's `Incoming`, axum's `Body`, `Full`, `BoxBody`
/// are), since a keyed response is read into a buffer and may be handed on part-read.
#[derive(Debug)]
pub struct IdempotencyService<S, St> {
    pub(crate) inner: S,
    pub(crate) store: Arc<St>,
    pub(crate) config: Arc<Config>,
}

impl<S: Clone, St> Clone for IdempotencyService<S, St> {
    fn clone(&self) -> Self {
        IdempotencyService {
            inner: self.inner.clone(),
            store: self.store.clone(),
            config: self.config.clone(),
        }
    }
}

type InnerBody<B> = Either<Full<Bytes>, B>;

impl<S, St, B, ResBody> Service<Request<B>> for IdempotencyService<S, St>
where
    S: Service<Request<InnerBody<B>>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: IdempotencyStore,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Unpin + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = &self.config;
        // What needs no await is decided here, so that each kind of request gets a future of
        // its own size: a keyed request's future never holds the inner service's future
        // (that one lives in the keyed call's own box, see `run`).
        let Some(value) = req.headers().get(&config.key_header) else {
            if config.required.contains(req.method()) {
                return Box::pin(ready(Ok(reply(
                    StatusCode::BAD_REQUEST,
                    "this request needs an Idempotency-Key header: a quoted string, such as \
                     \"8e03978e-40d5-43e8-bc93-6894a57f9324\"",
                ))));
            }
            let call = inner.call(req.map(Either::Right));
            return Box::pin(async move {
                let res = call.await?;
                Ok(res.map(|body| ResponseBody::stream(Bytes::new(), None, None, body)))
            });
        };
        let Some(key) = idempotency_key::parse(value) else {
            return Box::pin(ready(Ok(reply(
                StatusCode::BAD_REQUEST,
                "malformed Idempotency-Key: expected a quoted string (RFC 8941 sf-string) of \
                 printable ASCII, or a bare token of visible ASCII without quotes or backslashes; \
                 non-empty, at most 255 bytes",
            ))));
        };
        let key: Arc<str> = key.into();
        let (parts, body) = req.into_parts();
        Box::pin(keyed(
            inner,
            self.store.clone(),
            self.config.clone(),
            key,
            parts,
            body,
        ))
    }
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

pub(crate) fn retry_later<B>(
    status: StatusCode,
    message: &'static str,
) -> Response<ResponseBody<B>> {
    let mut res = reply(status, message);
    res.headers_mut()
        .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
    res
}

/// A keyed request: read its body, claim its key, then run it (or answer from the store).
/// An `async` block rather than an `async fn`, whose arguments would take room twice.
// Not an `async fn`: its arguments would take room twice in the future.
#[allow(clippy::manual_async_fn)]
fn keyed<S, St, B, ResBody>(
    inner: S,
    store: Arc<St>,
    config: Arc<Config>,
    key: Arc<str>,
    parts: http::request::Parts,
    body: B,
) -> impl Future<Output = Result<Response<ResponseBody<ResBody>>, S::Error>> + Send
where
    S: Service<Request<InnerBody<B>>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: IdempotencyStore,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Unpin + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    async move {
        let body = match read_body(body, config.max_request_bytes).await {
            Ok(body) => body,
            Err(ReadError::TooLarge) => {
                return Ok(reply(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "the request body is larger than this server keeps for idempotency keys",
                ))
            }
            Err(ReadError::Failed) => {
                return Ok(reply(
                    StatusCode::BAD_REQUEST,
                    "the request body could not be read",
                ))
            }
        };
        let shown = key.clone();
        let key: Arc<str> = match &config.scope {
            None => key,
            Some(scope) => match (scope.0)(&parts) {
                Some(scope) => scoped_key(&scope, &key).into(),
                None => {
                    return Ok(reply(
                        StatusCode::BAD_REQUEST,
                        "this server scopes Idempotency-Keys by client, and the request does not say which client sent it",
                    ))
                }
            },
        };
        let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        let fingerprint = Fingerprint::of(&parts.method, target, &body);
        let claim = match store.begin(&key, fingerprint, config.lease).await {
            Ok(Begin::Started(claim)) => claim,
            Ok(Begin::Existing(Entry::InFlight { fingerprint: first })) if first == fingerprint => {
                return Ok(retry_later(
                    StatusCode::CONFLICT,
                    "a request with this Idempotency-Key is still in progress; retry later",
                ))
            }
            Ok(Begin::Existing(Entry::Completed {
                fingerprint: first,
                response,
            })) if first == fingerprint => return Ok(replay(response, &config)),
            Ok(Begin::Existing(_)) => {
                return Ok(reply(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "this Idempotency-Key was already used with a different request",
                ))
            }
            Err(err) => {
                tracing::warn!(error = %err, cause = super::cause(&err), full = err.is_full(), "idempotency store refused a key; answering 503");
                return Ok(retry_later(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the server cannot track this Idempotency-Key right now; nothing was applied, retry later",
                ));
            }
        };

        // From here on the handler runs and its outcome is kept, even if this request goes away.
        let mut parts = parts;
        parts
            .extensions
            .insert(RequestKey::new(key.clone(), shown.clone()));
        let claimed = Claimed {
            store,
            config,
            key,
            shown,
            claim,
            fingerprint,
        };
        run::call(
            inner,
            claimed,
            Request::from_parts(parts, Either::Left(Full::new(body))),
        )
        .await
    }
}

pub(crate) enum ReadError {
    TooLarge,
    Failed,
}

/// A request body, read whole up to `limit` bytes (trailers are not part of it).
pub(crate) async fn read_body<B>(body: B, limit: usize) -> Result<Bytes, ReadError>
where
    B: Body<Data = Bytes>,
{
    if body.size_hint().lower() > limit as u64 {
        return Err(ReadError::TooLarge);
    }
    let mut body = std::pin::pin!(body);
    let mut data = Chunks::default();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return Err(ReadError::Failed);
        };
        if let Ok(chunk) = frame.into_data() {
            data.push(chunk);
            if data.len() > limit {
                return Err(ReadError::TooLarge);
            }
        }
    }
    Ok(data.into_bytes())
}

/// The chunks of a body read so far. Most bodies come in one chunk, kept as it is (no copy,
/// no allocation); later chunks are joined into one buffer.
#[derive(Default)]
pub(crate) struct Chunks {
    first: Bytes,
    joined: BytesMut,
}

impl Chunks {
    pub(crate) fn push(&mut self, chunk: Bytes) {
        if self.first.is_empty() && self.joined.is_empty() {
            self.first = chunk;
            return;
        }
        if !self.first.is_empty() {
            let first = std::mem::take(&mut self.first);
            self.joined.reserve(first.len() + chunk.len());
            self.joined.extend_from_slice(&first);
        }
        self.joined.extend_from_slice(&chunk);
    }

    pub(crate) fn len(&self) -> usize {
        self.first.len() + self.joined.len()
    }

    pub(crate) fn into_bytes(self) -> Bytes {
        if self.joined.is_empty() {
            self.first
        } else {
            self.joined.freeze()
        }
    }
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

/// A stored record as a response.
pub(crate) fn stored_response<B>(stored: &StoredResponse) -> Response<ResponseBody<B>> {
    let mut res = Response::new(ResponseBody::full(stored.body().clone()));
    *res.status_mut() = stored.status();
    *res.headers_mut() = stored.headers().clone();
    res
}

pub(crate) fn replay<B>(stored: StoredResponse, config: &Config) -> Response<ResponseBody<B>> {
    let mut res = stored_response(&stored);
    res.headers_mut().insert(
        config.replay_header.clone(),
        HeaderValue::from_static("true"),
    );
    res
}

pub(crate) enum Buffered<B> {
    Whole(Bytes),
    /// Not stored: too large, has trailers, or failed mid-way. Carries what was read, and the
    /// error that stopped the reading (the client must get it, not a clean end).
    Partial {
        prefix: Bytes,
        trailers: Option<HeaderMap>,
        error: Option<BoxError>,
        rest: B,
        why: &'static str,
    },
}

pub(crate) async fn buffer<B>(mut body: B, limit: usize) -> Buffered<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut data = Chunks::default();
    loop {
        match body.frame().await {
            None => return Buffered::Whole(data.into_bytes()),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(chunk) => {
                    data.push(chunk);
                    if data.len() > limit {
                        return Buffered::Partial {
                            prefix: data.into_bytes(),
                            trailers: None,
                            error: None,
                            rest: body,
                            why: "over the size limit",
                        };
                    }
                }
                Err(frame) => {
                    return Buffered::Partial {
                        prefix: data.into_bytes(),
                        trailers: frame.into_trailers().ok(),
                        error: None,
                        rest: body,
                        why: "it has trailers",
                    }
                }
            },
            Some(Err(err)) => {
                return Buffered::Partial {
                    prefix: data.into_bytes(),
                    trailers: None,
                    error: Some(err.into()),
                    rest: body,
                    why: "its body failed",
                }
            }
        }
    }
}
