//! The tower middleware: [`RetrySafety`], made by [`RetryPolicy`](crate::RetryPolicy)'s
//! [`Layer`](tower::Layer) impl.
//!
//! Put it outside a per-attempt timeout, over any HTTP client service:
//!
//! ```
//! use std::time::Duration;
//! use http_body_util::Full;
//! use bytes::Bytes;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use tower::ServiceBuilder;
//! use tower_retry_safety::RetryPolicy;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
//! let svc = ServiceBuilder::new()
//!     .layer(RetryPolicy::builder().max_retries(3).build()?)
//!     .timeout(Duration::from_secs(10)) // per attempt: its `Elapsed` is ambiguous
//!     .service(client);
//! # let _ = svc;
//! # Ok(()) }
//! ```
//!
//! For each request the service classifies the request, sends it, classifies the outcome and
//! asks the policy whether to retry. Before each retry it waits the backoff or the server's
//! Retry-After, then waits for the inner service to be ready. Attempts it makes are marked in
//! the request's extensions, so a second layer of this crate further in does not retry them
//! again. A response is always returned with its [`RetryReport`], even when retries ended on
//! it; an [`Error`](crate::Error) is returned only when the last attempt ended in an error.
//!
//! Dropping the response future stops everything: nothing more is sent.
//!
//! Each attempt is a `tracing` span (`HTTP attempt`, target `tower_retry_safety::attempt`)
//! with OpenTelemetry's HTTP client fields and the crate's decisions, entered around the inner
//! service's `call` and every poll; [`attempt_number`] reads an attempt's number further in.
//! Without a subscriber that wants INFO spans, none is made.

mod body;
mod future;
mod hedged;
mod layer;
pub(crate) mod replay;
pub(crate) mod report;
mod send;
#[allow(clippy::module_inception)]
mod service;

pub use body::ReplayBody;
pub use future::ResponseFuture;
pub use replay::{NotReplayable, Recorded, ReplayBuffer, Replayable};
pub use report::{AttemptRecord, RetryReport};
pub use service::RetrySafety;

/// Marks a request sent by a [`RetrySafety`] layer (or the reqwest adapter), so that an inner
/// layer of this crate leaves retrying to the outermost one (RFC 9110: a client SHOULD NOT retry a failed
/// automatic retry). A unit struct: inserting it allocates no box of its own.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LayerAttempt;

/// The header that carries the policy's idempotency key, put beside [`LayerAttempt`] only when
/// it is not `idempotency-key`: a front end that reads bodies
/// recognises a keyed write by it.
#[derive(Clone, Debug)]
pub(crate) struct KeyHeader(pub(crate) http::HeaderName);

impl KeyHeader {
    /// Whether `headers` carry a key: under the policy's header if the attempt's `extensions`
    /// name one, else under `idempotency-key`.
    pub(crate) fn in_request(headers: &http::HeaderMap, extensions: &http::Extensions) -> bool {
        match extensions.get::<KeyHeader>() {
            Some(KeyHeader(name)) => headers.contains_key(name),
            // A constant name: a `&str` would be parsed on every lookup.
            None => headers.contains_key(crate::policy::DEFAULT_KEY_HEADER),
        }
    }

    /// Marks an attempt's `extensions` with the policy's key header, when it is not the
    /// default.
    #[inline]
    pub(crate) fn mark(policy: &crate::RetryPolicy, extensions: &mut http::Extensions) {
        let headers = policy.headers();
        if headers.custom_key_header {
            extensions.insert(KeyHeader(headers.idempotency_key_header.clone()));
        }
    }
}

/// The number of a resend, in its request's extensions: 2 for the first resend (a retry or a
/// hedge), 3 for the next… Read it with [`attempt_number`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttemptNumber(pub(crate) u32);

/// Which attempt of a request this is, as the tower layer or the reqwest adapter sent it (1
/// for the first), read from the request's extensions by a layer or middleware further in —
/// tower-http's `trace`, reqwest-tracing — to tag its own span. `None` for a request this
/// crate did not send.
///
/// The first attempt carries no number of its own (only the layer's mark), so that it
/// allocates nothing more; each resend carries its number.
///
/// ```
/// # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// use tower::{service_fn, Layer, ServiceExt};
/// use tower_retry_safety::{attempt_number, RetryPolicy};
///
/// let policy = RetryPolicy::builder().build()?;
/// let svc = policy.layer(service_fn(|req: http::Request<String>| async move {
///     let n = attempt_number(req.extensions());
///     let status = if n == Some(1) { 503 } else { 200 };
///     http::Response::builder().status(status).body(format!("{n:?}"))
/// }));
/// let req = http::Request::get("http://api.example/items").body(String::new())?;
/// let res = svc.oneshot(req).await?;
/// assert_eq!(res.body(), "Some(2)");
/// assert_eq!(attempt_number(&http::Extensions::new()), None);
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap().block_on(demo()).unwrap();
/// ```
pub fn attempt_number(extensions: &http::Extensions) -> Option<u32> {
    match extensions.get::<AttemptNumber>() {
        Some(n) => Some(n.0),
        None => extensions.get::<LayerAttempt>().map(|_| 1),
    }
}
