//! The rule of the idempotency layer: which request runs, which is answered from the store,
//! and which is refused before its handler is called.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{Either, Full};
use tower_service::Service;

use crate::answers;
use crate::body::ResponseBody;
use crate::claim::Claimed;
use crate::derive::RequestKey;
use crate::future::ResponseFuture;
use crate::mode::{self, key_of, prepare, Config, InnerBody, Keyed};
use crate::observe::KeyHandling;
use crate::renewal::Renewals;
use crate::run;
use crate::store::{Begin, FencingToken, Fingerprint, IdempotencyStore};
use tower_retry_safety::BoxError;

/// The service of [`IdempotencyLayer`](crate::layer::IdempotencyLayer).
///
/// The inner service receives `Request<Either<Full<Bytes>, B>>`: the buffered body (`Left`) for
/// a keyed request, whose body was read for its fingerprint, and the untouched body (`Right`)
/// for any other request. axum's `Router` and any service generic over its body accept it.
/// The response body must be `Unpin` (hyper's `Incoming`, axum's `Body`, `Full`, `BoxBody`
/// are), since a keyed response is read into a buffer and may be handed on part-read.
#[derive(Debug)]
pub struct IdempotencyService<S, St> {
    pub(crate) inner: S,
    pub(crate) config: Arc<Config>,
    /// The store, and the layer's claims that are running, renewed on a schedule of their own.
    pub(crate) renewals: Arc<Renewals<St>>,
}

impl<S, St> IdempotencyService<S, St> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming this one.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, St> Clone for IdempotencyService<S, St> {
    fn clone(&self) -> Self {
        IdempotencyService {
            inner: self.inner.clone(),
            config: self.config.clone(),
            renewals: self.renewals.clone(),
        }
    }
}

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
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

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
        // A gRPC call gets the layer's own answers as gRPC statuses: one header read, for
        // keyed and refused requests only.
        let grpc =
            |req: &Request<B>| tower_retry_safety::wire::grpc::is_call(req.method(), req.headers());
        let key = match key_of(config, &req) {
            Ok(Some(key)) => key,
            Ok(None) => return ResponseFuture::passthrough(inner.call(req.map(Either::Right))),
            Err(bad) => {
                config.observe.keyed(req.method(), bad.handling());
                if grpc(&req) {
                    return ResponseFuture::reply(crate::grpc::answer(bad.reply()));
                }
                return ResponseFuture::reply(bad.reply());
            }
        };
        let grpc = grpc(&req);
        let (parts, body) = req.into_parts();
        let call = keyed(
            inner,
            self.renewals.clone(),
            self.config.clone(),
            key,
            parts,
            body,
        );
        if grpc {
            return ResponseFuture::keyed(Box::pin(
                async move { call.await.map(crate::grpc::answer) },
            ));
        }
        ResponseFuture::keyed(Box::pin(call))
    }
}

/// A keyed request: read its body, claim its key, then run it (or answer from the store).
/// An `async` block rather than an `async fn`, whose arguments would take room twice.
// Not an `async fn`: its arguments would take room twice in the future.
#[allow(clippy::manual_async_fn)]
fn keyed<S, St, B, ResBody>(
    inner: S,
    renewals: Arc<Renewals<St>>,
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
        let shown = key;
        let Keyed {
            body,
            key,
            fingerprint,
        } = match prepare(&config, &shown, &parts, body).await {
            Ok(keyed) => keyed,
            Err(answer) => {
                config.observe.keyed(&parts.method, KeyHandling::Rejected);
                return Ok(answer);
            }
        };
        let observe = |outcome| config.observe.keyed(&parts.method, outcome);
        // The store's lease starts when it takes the claim, after this: renewals are timed
        // from here, so a slow reply to `begin` eats none of the margin.
        let sent = renewals.now();
        let store = renewals.store().clone();
        let token = match begin(&*store, &key, fingerprint, &config).await {
            Ok(token) => token,
            Err((outcome, answer)) => {
                observe(outcome);
                return Ok(answer);
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
            token,
            fingerprint,
        };
        let Ok(renewal) = renewals.hold(&claimed.key, &claimed.shown, claimed.token, sent) else {
            return Ok(no_timer(claimed, &parts.method).await);
        };
        claimed
            .config
            .observe
            .keyed(&parts.method, KeyHandling::Claimed);
        run::call(
            inner,
            claimed,
            renewal,
            Request::from_parts(parts, Either::Left(Full::new(body))),
        )
        .await
    }
}

/// Claims `key`, or the answer to a request that may not run: 409 while the first runs, the
/// stored response, 422 for another request under the key, 503 when the store fails.
async fn begin<St: IdempotencyStore, B>(
    store: &St,
    key: &str,
    fingerprint: Fingerprint,
    config: &Config,
) -> Result<FencingToken, (KeyHandling, Response<ResponseBody<B>>)> {
    match store.begin(key, fingerprint, config.lease).await {
        Ok(Begin::Started(token)) => Ok(token),
        Ok(Begin::Existing(entry)) => Err(mode::taken(entry, fingerprint, config)),
        Err(err) => {
            tracing::warn!(error = %err, cause = crate::store::cause(&err), full = err.is_full(), "idempotency store refused a key; answering 503");
            Err((KeyHandling::StoreError, answers::cannot_track()))
        }
    }
}

/// A claim taken on a runtime without a timer (its lease could not be renewed): nothing ran,
/// so the claim is freed, and the answer is 503.
async fn no_timer<St: IdempotencyStore, B>(
    claimed: Claimed<St>,
    method: &http::Method,
) -> Response<ResponseBody<B>> {
    claimed
        .config
        .observe
        .keyed(method, KeyHandling::Unavailable);
    tracing::error!("IdempotencyLayer needs a tokio runtime with its timer enabled (`enable_time`): answering 503");
    let _ = claimed.store.release(&claimed.key, claimed.token).await;
    answers::cannot_track()
}
