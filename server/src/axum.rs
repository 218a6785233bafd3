//! The server layer with axum's body type (feature `axum`): wraps a whole `Router` for
//! `axum::serve`, which takes services that answer `Response<axum::body::Body>`.

use std::task::{Context, Poll};

use axum_core::body::Body;
use http::{Request, Response};
use tower_layer::Layer;
use tower_service::Service;

use crate::body::ResponseBody;
use crate::future::AxumResponseFuture;
use crate::layer::IdempotencyLayer;
use crate::service::IdempotencyService;
use crate::store::IdempotencyStore;

impl<St: IdempotencyStore> IdempotencyLayer<St> {
    /// This layer, answering with axum's body type: for wrapping a whole axum `Router`
    /// served by `axum::serve`, which takes only services that answer
    /// `Response<axum::body::Body>` (feature `axum`). `Router::layer` needs no conversion:
    /// it takes this layer as it is.
    ///
    /// ```
    /// use axum::{routing::post, Router};
    /// use tower::Layer;
    /// use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};
    ///
    /// let keys = IdempotencyLayer::new(MemoryStore::new());
    /// let router = Router::new().route("/v1/messages", post(|| async { "sent" }));
    ///
    /// // Every route of the router, and its 404s, behind one layer:
    /// let app = keys.clone().for_axum().layer(router);
    /// # let _ = async {
    /// # let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    /// axum::serve(listener, tower::make::Shared::new(app)).await?;
    /// # Ok::<(), std::io::Error>(()) };
    ///
    /// // Or per route, as `Router::layer` applies layers:
    /// let per_route: Router = Router::new()
    ///     .route("/v1/messages", post(|| async { "sent" }))
    ///     .layer(keys);
    /// # drop(per_route);
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    pub fn for_axum(self) -> AxumIdempotencyLayer<St> {
        AxumIdempotencyLayer { inner: self }
    }
}

/// [`IdempotencyLayer`] answering with axum's body type (`Response<axum::body::Body>`), so
/// that a whole axum `Router` wrapped in it is a service `axum::serve` takes. Made by
/// [`IdempotencyLayer::for_axum`]; everything else is the same layer.
///
/// # Clone
///
/// Clones share the store (behind an `Arc`).
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
#[derive(Debug, Clone)]
pub struct AxumIdempotencyLayer<St> {
    inner: IdempotencyLayer<St>,
}

impl<S, St> Layer<S> for AxumIdempotencyLayer<St> {
    type Service = AxumIdempotencyService<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        AxumIdempotencyService {
            inner: self.inner.layer(inner),
        }
    }
}

/// The service of [`AxumIdempotencyLayer`]: [`IdempotencyService`] whose response body is
/// axum's `Body`.
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
#[derive(Debug)]
pub struct AxumIdempotencyService<S, St> {
    inner: IdempotencyService<S, St>,
}

impl<S: Clone, St> Clone for AxumIdempotencyService<S, St> {
    fn clone(&self) -> Self {
        AxumIdempotencyService {
            inner: self.inner.clone(),
        }
    }
}

impl<S, St> AxumIdempotencyService<S, St> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner.inner
    }
}

impl<S, St, B, ResBody> Service<Request<B>> for AxumIdempotencyService<S, St>
where
    IdempotencyService<S, St>: Service<Request<B>, Response = Response<ResponseBody<ResBody>>>,
    ResponseBody<ResBody>:
        http_body::Body<Data = bytes::Bytes, Error = tower_retry_safety::BoxError>,
    ResBody: Send + 'static,
{
    type Response = Response<Body>;
    type Error = <IdempotencyService<S, St> as Service<Request<B>>>::Error;
    type Future = AxumResponseFuture<<IdempotencyService<S, St> as Service<Request<B>>>::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        AxumResponseFuture::new(self.inner.call(req))
    }
}
