//! The layer and its service: read, cap, answer or scope.

use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, HeaderName, Request};
use tower::{Layer, Service};
use tower_retry_safety::deadline::{self, BadDeadline, Inbound, ATTEMPT_HEADER, TIMEOUT_HEADER};

use super::answer::Note;
use super::future::ResponseFuture;

/// Reads each request's deadline, caps it, and runs the request inside it (see the
/// [module docs](super)).
///
/// # Clone
/// Cloning is cheap: the settings are a few words.
#[derive(Clone, Debug)]
pub struct DeadlineLayer {
    max: Duration,
    timeout_header: HeaderName,
    attempt_header: HeaderName,
}

impl DeadlineLayer {
    /// A layer that gives a caller at most `max`: the deadline of a request that names a
    /// longer one, or none.
    pub fn new(max: Duration) -> Self {
        DeadlineLayer {
            max,
            timeout_header: TIMEOUT_HEADER,
            attempt_header: ATTEMPT_HEADER,
        }
    }

    /// The header an HTTP request's time left comes in, in milliseconds.
    ///
    /// Defaults to [`TIMEOUT_HEADER`] (`request-timeout-ms`).
    pub fn timeout_header(mut self, name: HeaderName) -> Self {
        self.timeout_header = name;
        self
    }

    /// The header an HTTP request's attempt number comes in: its presence says the caller
    /// retries.
    ///
    /// Defaults to [`ATTEMPT_HEADER`] (`request-attempt`).
    pub fn attempt_header(mut self, name: HeaderName) -> Self {
        self.attempt_header = name;
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
    S: Service<Request<B>, Response = http::Response<ResBody>>,
{
    type Response =
        http::Response<http_body_util::Either<ResBody, http_body_util::Empty<bytes::Bytes>>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let grpc = tower_retry_safety::wire::grpc::is_call(req.method(), req.headers());
        let (inbound, note) = self.layer.read(req.headers(), grpc);
        // Read when the inner service is about to be called: a wait for it to be ready
        // counts against the caller's deadline too.
        if inbound.has_passed() {
            return ResponseFuture::gone(grpc, note);
        }
        req.extensions_mut().insert(inbound);
        ResponseFuture::scoped(deadline::scope(inbound, self.inner.call(req)), note)
    }
}

impl DeadlineLayer {
    /// The request's deadline, capped, and what the answer says of the header.
    fn read(&self, headers: &HeaderMap, grpc: bool) -> (Inbound, Option<Note>) {
        let asked = if grpc {
            headers
                .get(tower_retry_safety::wire::grpc::GRPC_TIMEOUT)
                .map(deadline::parse_grpc_timeout)
        } else {
            headers
                .get(&self.timeout_header)
                .map(deadline::parse_timeout_ms)
        };
        let (timeout, note) = match asked {
            None => (self.max, None),
            Some(Ok(timeout)) if timeout > self.max => (self.max, Some(Note::Capped)),
            Some(Ok(timeout)) => (timeout, None),
            Some(Err(BadDeadline::TooLong)) => (self.max, Some(Note::TooLong)),
            Some(Err(_)) => (self.max, Some(Note::Malformed)),
        };
        let retries = if grpc {
            headers.contains_key(tower_retry_safety::wire::grpc::PREVIOUS_ATTEMPTS)
                || headers.contains_key(&self.attempt_header)
        } else {
            headers
                .get(&self.attempt_header)
                .and_then(deadline::parse_attempt)
                .is_some()
        };
        (Inbound::within(timeout).with_caller_retries(retries), note)
    }
}
