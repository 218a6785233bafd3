//! The response future of `AxumIdempotencyService` (feature `axum`): the layer's answer with
//! its body turned into axum's.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum_core::body::Body;
use http::Response;
use pin_project_lite::pin_project;

use crate::body::ResponseBody;

pin_project! {
    /// The response future of [`AxumIdempotencyService`](crate::AxumIdempotencyService).
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    pub struct AxumResponseFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F> AxumResponseFuture<F> {
    pub(crate) fn new(inner: F) -> Self {
        AxumResponseFuture { inner }
    }
}

impl<F> std::fmt::Debug for AxumResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AxumResponseFuture").finish_non_exhaustive()
    }
}

impl<F, ResBody, E> Future for AxumResponseFuture<F>
where
    F: Future<Output = Result<Response<ResponseBody<ResBody>>, E>>,
    ResponseBody<ResBody>:
        http_body::Body<Data = bytes::Bytes, Error = tower_retry_safety::BoxError>,
    ResBody: Send + 'static,
{
    type Output = Result<Response<Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project()
            .inner
            .poll(cx)
            .map(|res| res.map(|res| res.map(Body::new)))
    }
}
