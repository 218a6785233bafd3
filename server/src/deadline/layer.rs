//! The layer and its service: read the conventions, cap, answer or call.

use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderName, Request};
use tower::{Layer, Service};
use tower_retry_safety::deadline::Inbound;

use super::body::DeadlineBody;
use super::conventions::Conventions;
use super::future::DeadlineFuture;

/// Reads each request's deadline, caps it, and runs the request inside it (see the
/// [module docs](super)). Place it outermost: a wait above it cannot be counted.
///
/// # Clone
/// Cloning is cheap: the settings are a few words.
#[derive(Clone, Debug)]
pub struct DeadlineLayer {
    max: Duration,
    conventions: Conventions,
}

impl DeadlineLayer {
    /// A layer that gives a caller at most `max`: the deadline of a request that names a
    /// longer one, or none.
    pub fn new(max: Duration) -> Self {
        DeadlineLayer {
            max,
            conventions: Conventions::default(),
        }
    }

    /// The server's own header for an HTTP request's time left, in milliseconds, read beside
    /// the other conventions (the [module docs](super)' table); a note on it is the bare
    /// value. Naming another convention's header here reads that header once, as this one.
    ///
    /// Defaults to [`TIMEOUT_HEADER`](tower_retry_safety::deadline::TIMEOUT_HEADER)
    /// (`request-timeout-ms`).
    pub fn timeout_header(mut self, name: HeaderName) -> Self {
        self.conventions = self.conventions.with_timeout_header(name);
        self
    }

    /// The server's own header for an HTTP request's attempt number (from 1), read beside
    /// the other conventions: its presence says the caller retries.
    ///
    /// Defaults to [`ATTEMPT_HEADER`](tower_retry_safety::deadline::ATTEMPT_HEADER)
    /// (`request-attempt`).
    pub fn attempt_header(mut self, name: HeaderName) -> Self {
        self.conventions = self.conventions.with_attempt_header(name);
        self
    }
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`DeadlineLayer`].
///
/// Its inner service must be `Clone`: each request waits for its own clone to be ready,
/// inside its response future, where the wait is timed by the caller's deadline (tower's
/// `Buffer` and `Oneshot` do the same).
#[derive(Clone, Debug)]
pub struct Deadline<S> {
    inner: S,
    layer: DeadlineLayer,
}

impl<S> Deadline<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, this one dropped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B, ResBody> Service<Request<B>> for Deadline<S>
where
    S: Service<Request<B>, Response = http::Response<ResBody>> + Clone,
{
    type Response = http::Response<DeadlineBody<ResBody>>;
    type Error = S::Error;
    type Future = DeadlineFuture<S, Request<B>>;

    /// Always ready: a request's deadline counts from its arrival (its `call`), so the wait
    /// for the inner service happens in the response future, where it is timed.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        // The arrival: the deadline counts from here.
        let read = self.layer.conventions.read(req.headers(), self.layer.max);
        let inbound = Inbound::within(read.timeout).with_caller_retries(read.caller_retries);
        let grpc = tower_retry_safety::wire::grpc::is_call(req.method(), req.headers());
        if inbound.has_passed() {
            return DeadlineFuture::gone(inbound, read.notes, grpc);
        }
        req.extensions_mut().insert(inbound);
        // The service that was given (it may have been readied through `get_mut`) goes with
        // the request; a clone stays for the next.
        let clone = self.inner.clone();
        let service = std::mem::replace(&mut self.inner, clone);
        DeadlineFuture::waiting(service, req, inbound, read.notes, grpc)
    }
}
