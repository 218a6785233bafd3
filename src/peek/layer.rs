use std::sync::Arc;

use http::{HeaderMap, StatusCode};
use tower_layer::Layer;

use super::classifier::Classifier;
use super::PeekBody;
use crate::classify::FailureClass;

/// Reads the beginning of a response's body so that a classifier that knows the API can
/// classify the response by it — a 200 whose JSON says "rate limited", a documented "not
/// processed" error code. Put it inside [`RetrySafety`](crate::service::RetrySafety): the layer reads
/// the verdict with the same limits as
/// [`classify_responses_with`](crate::RetryPolicyBuilder::classify_responses_with) — only
/// `Some(FailureClass::NotSent)` (proof that nothing was applied) makes a write that may have
/// been applied retryable.
///
/// Only a body that ends within `limit` bytes (and 1,024 frames) is classified; what was read
/// is handed on in front of the rest ([`PeekedBody`](crate::peek::PeekedBody)), empty chunks left
/// out. By default only a body whose length the transport knows (a content-length it honours,
/// not a chunked body that also sends one) within the limit is read, so a stream is never
/// waited on; widen it with [`when`](Self::when). The verdict is used up by the retry layer
/// that decides on it: it never reaches an outer one. Of two stacked classifiers, the stricter
/// verdict holds. A classifier that panics panics the request's task, as a service would.
///
/// ```
/// use std::time::Duration;
/// use bytes::Bytes;
/// use http_body_util::Full;
/// use hyper_util::client::legacy::Client;
/// use hyper_util::rt::TokioExecutor;
/// use tower::ServiceBuilder;
/// use tower_retry_safety::peek::PeekBodyLayer;
/// use tower_retry_safety::{FailureClass, RetryPolicy};
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

    /// Which responses to read. Defaults to those whose length the transport knows to be
    /// within the limit. A response chosen here that streams slowly delays the response until
    /// the limit is read (or the retry layer's attempt timeout cuts it); one that sends a body
    /// of a known length slowly delays it the same way.
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
