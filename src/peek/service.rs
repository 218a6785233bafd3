use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::classifier::Classifier;
use super::future::ResponseFuture;
use super::PeekedBody;

/// Reads and classifies response bodies; made by [`PeekBodyLayer`](crate::peek::PeekBodyLayer).
#[derive(Clone, Debug)]
pub struct PeekBody<S> {
    inner: S,
    classifier: Arc<Classifier>,
}

impl<S> PeekBody<S> {
    pub(crate) fn new(inner: S, classifier: Arc<Classifier>) -> Self {
        PeekBody { inner, classifier }
    }
}

impl<S, ReqBody, B> Service<Request<ReqBody>> for PeekBody<S>
where
    S: Service<Request<ReqBody>, Response = Response<B>>,
    B: Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Send,
{
    type Response = Response<PeekedBody<B>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        ResponseFuture::new(self.inner.call(req), self.classifier.clone())
    }
}
