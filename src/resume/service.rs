use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use http::{HeaderMap, Method};
use tower::ServiceExt;

use super::cut::NoResume;
use super::future::ResponseFuture;
use super::resumer::{Again, SendRange};
use super::WholeBody;
use crate::attempt_clock::AttemptClock;
use crate::{BoxError, ReplayBody};

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
    S: Service<Request<ReqBody>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    ReqBody: ReplayBody + Send + 'static,
    B: Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<WholeBody<B>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // A GET is resumed with `Range`, a keyed write sent again whole with its key: keep
        // what sends it again (its body must copy).
        let keyed_write = req.method() != Method::GET && has_key(&req);
        let again = if req.method() == Method::GET || keyed_write {
            sender(self.inner.clone(), &req)
                .map(|send| Again { send, keyed_write })
                .ok_or(NoResume::NotRepeatable)
        } else {
            Err(NoResume::NotRepeatable)
        };
        // A write that nothing makes safe to repeat would never be sent again: reading its
        // body inside the attempt would only put it under the attempt's clock, and a slow body
        // would cost the caller the response. It streams.
        let limit = if may_repeat(&req) { self.limit } else { 0 };
        let clock = req.extensions().get::<AttemptClock>().cloned();
        ResponseFuture::new(self.inner.call(req), limit, again, clock)
    }
}

/// Whether the retry layer may send `req` again: idempotent by its method (RFC 9110 §9.2.2),
/// or carrying an `Idempotency-Key`. The retry layer decides with its rules and markers too;
/// this layer cannot see them, so a request they call idempotent is only streamed.
fn may_repeat<B>(req: &Request<B>) -> bool {
    req.method().is_idempotent() || has_key(req)
}

fn has_key<B>(req: &Request<B>) -> bool {
    req.headers().contains_key("idempotency-key")
}

/// What sends `req` again with more headers, through a clone of the service.
fn sender<S, ReqBody, B>(service: S, req: &Request<ReqBody>) -> Option<SendRange<B>>
where
    S: Service<Request<ReqBody>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    ReqBody: ReplayBody + Send + 'static,
    B: Send + 'static,
{
    let body = req.body().try_clone_body()?;
    let method = req.method().clone();
    let uri = req.uri().clone();
    let version = req.version();
    let headers = req.headers().clone();
    let extensions = req.extensions().clone();
    Some(Box::new(move |more: HeaderMap| {
        let again = body.try_clone_body().map(|body| {
            let mut again = Request::new(body);
            *again.method_mut() = method.clone();
            *again.uri_mut() = uri.clone();
            *again.version_mut() = version;
            *again.headers_mut() = headers.clone();
            again.headers_mut().extend(more);
            *again.extensions_mut() = extensions.clone();
            again
        });
        let service = service.clone();
        Box::pin(async move {
            let again = again.ok_or("the request body could not be copied")?;
            service.oneshot(again).await.map_err(Into::into)
        })
    }))
}
