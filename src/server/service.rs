use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Either, Full, Limited};
use tower_service::Service;

use super::layer::Config;
use super::store::{Begin, Entry, Fingerprint, IdempotencyStore, StoredResponse};
use super::ResponseBody;
use crate::attempts::cap;
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
    S::Future: Send,
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
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(handle(inner, self.store.clone(), self.config.clone(), req))
    }
}

fn reply<B>(status: StatusCode, message: &'static str) -> Response<ResponseBody<B>> {
    let mut res = Response::new(ResponseBody::full(Bytes::from_static(message.as_bytes())));
    *res.status_mut() = status;
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    res
}

fn retry_later<B>(status: StatusCode, message: &'static str) -> Response<ResponseBody<B>> {
    let mut res = reply(status, message);
    res.headers_mut()
        .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
    res
}

async fn handle<S, St, B, ResBody>(
    mut inner: S,
    store: Arc<St>,
    config: Arc<Config>,
    req: Request<B>,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<InnerBody<B>>, Response = Response<ResBody>>,
    St: IdempotencyStore,
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Unpin,
    ResBody::Error: Into<BoxError>,
{
    let Some(value) = req.headers().get(&config.key_header) else {
        if config.required.contains(req.method()) {
            return Ok(reply(
                StatusCode::BAD_REQUEST,
                "this request needs an Idempotency-Key header: a quoted string, such as \
                 \"8e03978e-40d5-43e8-bc93-6894a57f9324\"",
            ));
        }
        let res = inner.call(req.map(Either::Right)).await?;
        return Ok(res.map(|body| ResponseBody::stream(Bytes::new(), None, body)));
    };
    let Some(key) = idempotency_key::parse_sf_string(value) else {
        return Ok(reply(
            StatusCode::BAD_REQUEST,
            "malformed Idempotency-Key: expected a non-empty quoted string (RFC 8941 sf-string) \
             of printable ASCII, at most 255 bytes",
        ));
    };
    let key: Arc<str> = key.into();
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, config.max_request_bytes).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => {
            return Ok(reply(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the request body is larger than this server keeps for idempotency keys",
            ))
        }
        Err(_) => {
            return Ok(reply(
                StatusCode::BAD_REQUEST,
                "the request body could not be read",
            ))
        }
    };
    let fingerprint = Fingerprint::of(&parts.method, parts.uri.path(), &body);
    match store.begin(&key, fingerprint, config.ttl).await {
        Ok(Begin::Started) => {}
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
            tracing::warn!(error = %err, full = err.is_full(), "idempotency store refused a key; answering 503");
            return Ok(retry_later(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server cannot track this Idempotency-Key right now; nothing was applied, retry later",
            ));
        }
    }

    let mut guard = Release {
        store: store.clone(),
        key: Some(key.clone()),
    };
    let res = match inner
        .call(Request::from_parts(parts, Either::Left(Full::new(body))))
        .await
    {
        Ok(res) => res,
        Err(err) => {
            // No response at all: nothing to replay, so the key is free for a retry.
            guard.release_now().await;
            return Err(err);
        }
    };
    let (parts, body) = res.into_parts();
    match buffer(body, config.max_response_bytes).await {
        Buffered::Whole(bytes) => {
            let record = StoredResponse::new(parts.status, parts.headers.clone(), bytes.clone());
            match store.complete(&key, fingerprint, record, config.ttl).await {
                Ok(()) => guard.disarm(),
                Err(err) => {
                    tracing::warn!(error = %err, key = cap(&key, 64), "response not stored for an idempotency key; the key is freed");
                    guard.release_now().await;
                }
            }
            Ok(Response::from_parts(parts, ResponseBody::full(bytes)))
        }
        Buffered::Partial {
            prefix,
            trailers,
            rest,
            why,
        } => {
            tracing::warn!(
                key = cap(&key, 64),
                limit = config.max_response_bytes,
                why,
                "response passed through unstored for an idempotency key; the key is freed"
            );
            guard.release_now().await;
            Ok(Response::from_parts(
                parts,
                ResponseBody::stream(prefix, trailers, rest),
            ))
        }
    }
}

fn replay<B>(stored: StoredResponse, config: &Config) -> Response<ResponseBody<B>> {
    let mut res = Response::new(ResponseBody::full(stored.body().clone()));
    *res.status_mut() = stored.status();
    *res.headers_mut() = stored.headers().clone();
    res.headers_mut().insert(
        config.replay_header.clone(),
        HeaderValue::from_static("true"),
    );
    res
}

enum Buffered<B> {
    Whole(Bytes),
    /// Not stored: too large, has trailers, or failed mid-way. Carries what was read.
    Partial {
        prefix: Bytes,
        trailers: Option<HeaderMap>,
        rest: B,
        why: &'static str,
    },
}

async fn buffer<B>(mut body: B, limit: usize) -> Buffered<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    let mut data = BytesMut::new();
    loop {
        match body.frame().await {
            None => return Buffered::Whole(data.freeze()),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(chunk) => {
                    data.extend_from_slice(&chunk);
                    if data.len() > limit {
                        return Buffered::Partial {
                            prefix: data.freeze(),
                            trailers: None,
                            rest: body,
                            why: "over the size limit",
                        };
                    }
                }
                Err(frame) => {
                    return Buffered::Partial {
                        prefix: data.freeze(),
                        trailers: frame.into_trailers().ok(),
                        rest: body,
                        why: "it has trailers",
                    }
                }
            },
            Some(Err(_)) => {
                return Buffered::Partial {
                    prefix: data.freeze(),
                    trailers: None,
                    rest: body,
                    why: "its body failed",
                }
            }
        }
    }
}

/// Frees the key if the request ends without a stored response — including when the
/// request's future is dropped (the client went away) before the handler finished.
struct Release<St: IdempotencyStore> {
    store: Arc<St>,
    key: Option<Arc<str>>,
}

impl<St: IdempotencyStore> Release<St> {
    fn disarm(&mut self) {
        self.key = None;
    }

    async fn release_now(&mut self) {
        if let Some(key) = self.key.take() {
            if let Err(err) = self.store.release(&key).await {
                tracing::warn!(error = %err, "could not free an idempotency key; it expires with its TTL");
            }
        }
    }
}

impl<St: IdempotencyStore> Drop for Release<St> {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let store = self.store.clone();
                runtime.spawn(async move {
                    let _ = store.release(&key).await;
                });
            }
            Err(_) => tracing::warn!(
                "an idempotency key was left in flight outside a runtime; it expires with its TTL"
            ),
        }
    }
}
