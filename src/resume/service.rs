use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use http::{Extensions, HeaderMap, Method};
use tower::ServiceExt;

use super::cut::NoResume;
use super::future::ResponseFuture;
use super::resumer::{Again, SendRange};
use super::WholeBody;
use crate::attempt_clock::AttemptClock;
use crate::box_error::BoxError;
use crate::service::KeyHeader;
use crate::service::ReplayBody;

/// Reads response bodies within a limit inside the attempt; made by
/// [`ReadWholeLayer`](crate::resume::ReadWholeLayer).
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
        let plan = ReadPlan::of(req.method(), req.headers(), req.extensions(), self.limit);
        let again = match plan.resend {
            true => sender(self.inner.clone(), &req)
                .map(|send| Again {
                    send,
                    keyed_write: plan.keyed_write,
                })
                .ok_or(NoResume::NotRepeatable),
            false => Err(NoResume::NotRepeatable),
        };
        ResponseFuture::new(self.inner.call(req), plan.limit, again, plan.clock)
    }
}

/// What a body reader (both front ends) does with a request.
pub(crate) struct ReadPlan {
    /// Not a `GET`, with an idempotency key: sent again whole with its key, never with `Range`.
    pub(crate) keyed_write: bool,
    /// Whether to keep what sends the request again to resume its body: a `GET` (with
    /// `Range`) or a keyed write, which the retry layer may send again.
    pub(crate) resend: bool,
    /// The read limit: 0 streams the body (a request the retry layer would not send again).
    pub(crate) limit: u64,
    /// The attempt's clock, if the retry layer gave it one.
    pub(crate) clock: Option<AttemptClock>,
}

impl ReadPlan {
    pub(crate) fn of(
        method: &Method,
        headers: &HeaderMap,
        extensions: &Extensions,
        limit: u64,
    ) -> Self {
        let has_key = KeyHeader::in_request(headers, extensions);
        let clock = extensions.get::<AttemptClock>().cloned();
        // The retry layer says, with its clock, whether this attempt could be followed by
        // another (its rules, markers, trust in keys and retries left); without a clock, the
        // method and the key say whether the request may be sent again. A request that would
        // never be sent again streams: reading its body inside the attempt would only put it
        // under the attempt's clock, and a slow body would cost the caller the response.
        let layer_may_repeat = clock.as_ref().is_none_or(|c| c.may_repeat);
        let may_repeat = layer_may_repeat && (method.is_idempotent() || has_key);
        let keyed_write = method != Method::GET && has_key;
        ReadPlan {
            keyed_write,
            resend: layer_may_repeat && (method == Method::GET || keyed_write),
            limit: if may_repeat { limit } else { 0 },
            clock,
        }
    }
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
