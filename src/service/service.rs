use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::future::ResponseFuture;
use super::ReplayBody;
use crate::attempts::Error;
use crate::box_error::BoxError;
use crate::policy::RetryPolicy;

/// Retries requests through `S` as the [`RetryPolicy`] allows. Made by the policy's
/// [`Layer`](tower::Layer) impl or [`RetrySafety::new`].
///
/// # Clone
///
/// Clones share the policy and its retry budget (behind an `Arc`) and clone the inner service.
/// Each retry is sent through a clone of the inner service taken when the request arrived,
/// after waiting for that clone to be ready.
#[derive(Clone, Debug)]
pub struct RetrySafety<S> {
    inner: S,
    policy: RetryPolicy,
}

impl<S> RetrySafety<S> {
    /// Wraps `inner` with `policy`.
    pub fn new(inner: S, policy: RetryPolicy) -> Self {
        RetrySafety { inner, policy }
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B, ResBody> Service<Request<B>> for RetrySafety<S>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
    S::Error: Into<BoxError>,
    B: ReplayBody,
{
    type Response = Response<ResBody>;
    type Error = Error;
    type Future = ResponseFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| Error::not_ready(e.into()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The first attempt goes through the service that `poll_ready` readied; retries go
        // through a clone, taken only for a request that may be retried and readied again
        // before each use (see `ResponseFuture`).
        ResponseFuture::start(&mut self.inner, &self.policy, req)
    }
}
