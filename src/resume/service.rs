use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::future::ResponseFuture;
use super::WholeBody;
use crate::BoxError;

/// Reads response bodies within a limit inside the attempt; made by
/// [`ReadWholeLayer`](crate::ReadWholeLayer).
#[derive(Clone, Debug)]
pub struct ReadWhole<S> {
    inner: S,
    limit: u64,
}

impl<S> ReadWhole<S> {
    pub(crate) fn new(inner: S, limit: u64) -> Self {
        ReadWhole { inner, limit }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, taken out.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, B> Service<Request<ReqBody>> for ReadWhole<S>
where
    S: Service<Request<ReqBody>, Response = Response<B>>,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Response = Response<WholeBody<B>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        ResponseFuture::new(self.inner.call(req), self.limit)
    }
}
