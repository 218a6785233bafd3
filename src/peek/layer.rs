use std::sync::Arc;

use http::{HeaderMap, StatusCode};
use tower_layer::Layer;

use super::classifier::Classifier;
use super::PeekBody;
use crate::FailureClass;

/// Reads the beginning of a response's body so that a classifier that knows the API can
/// classify the response by it — a 200 whose JSON says "rate limited", a documented "not
/// processed" error code. Put it inside [`RetrySafety`](crate::RetrySafety): the layer reads
/// the verdict with the same limits as
/// [`classify_responses_with`](crate::RetryPolicyBuilder::classify_responses_with) — only
/// `Some(FailureClass::NotSent)` (proof that nothing was applied) makes a write that may have
/// been applied retryable.
///
/// Only a body that ends within `limit` bytes is classified; what was read is handed on in
/// front of the rest ([`PeekedBody`](crate::PeekedBody)). By default only a response that
/// declares a content-length within the limit is read, so a stream is never waited on; widen
/// it with [`when`](Self::when).
///
/// ```
/// use std::time::Duration;
/// use bytes::Bytes;
/// use http_body_util::Full;
/// use hyper_util::client::legacy::Client;
/// use hyper_util::rt::TokioExecutor;
/// use tower::ServiceBuilder;
/// use tower_retry_safety::{FailureClass, PeekBodyLayer, RetryPolicy};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
/// let svc = ServiceBuilder::new()
///     .layer(RetryPolicy::builder().build()?)
///     .timeout(Duration::from_secs(10))
///     // This API answers 200 with `"error":"rate_limited"` before it runs anything.
///     .layer(PeekBodyLayer::new(4096, |_status, _headers, body: &[u8]| {
///         let limited = body.windows(14).any(|w| w == b"\"rate_limited\"");
///         limited.then_some(FailureClass::NotSent)
///     }))
///     .service(client);
/// # let _ = svc;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct PeekBodyLayer {
    classifier: Arc<Classifier>,
}

impl PeekBodyLayer {
    /// Reads bodies up to `limit` bytes and classifies each one that ends within it with
    /// `classify(status, headers, body)`: `None` leaves the response to the policy.
    pub fn new<F>(limit: usize, classify: F) -> Self
    where
        F: Fn(StatusCode, &HeaderMap, &[u8]) -> Option<FailureClass> + Send + Sync + 'static,
    {
        PeekBodyLayer {
            classifier: Arc::new(Classifier::new(limit, classify)),
        }
    }

    /// Which responses to read. Defaults to those that declare a content-length within the
    /// limit. A response chosen here that streams without end delays the response until the
    /// limit is read (or the layer's attempt timeout cuts it).
    pub fn when<F>(self, when: F) -> Self
    where
        F: Fn(StatusCode, &HeaderMap) -> bool + Send + Sync + 'static,
    {
        let classifier = Classifier::clone(&self.classifier).when(when);
        PeekBodyLayer {
            classifier: Arc::new(classifier),
        }
    }
}

impl<S> Layer<S> for PeekBodyLayer {
    type Service = PeekBody<S>;

    fn layer(&self, inner: S) -> PeekBody<S> {
        PeekBody::new(inner, self.classifier.clone())
    }
}
