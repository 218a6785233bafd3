//! Response bodies classified by what they say, in a reqwest-middleware stack.

use std::sync::Arc;

use http::{Extensions, HeaderMap, StatusCode};
use reqwest::{Request, Response, ResponseBuilderExt};
use reqwest_middleware::{Middleware, Next};

use crate::classify::BodyVerdict;
use crate::classify::FailureClass;
use crate::peek::classifier::Classifier;

/// [`PeekBodyLayer`](crate::peek::PeekBodyLayer) for reqwest-middleware: reads the beginning of a
/// response's body so that a classifier that knows the API can classify the response by it.
/// Add it after [`RetrySafetyMiddleware`](crate::reqwest::RetrySafetyMiddleware), so that it runs on
/// every attempt. The response keeps its status, headers, version, URL and extensions; what
/// was read is sent again in front of the rest of the body.
///
/// ```
/// use reqwest_middleware::ClientBuilder;
/// use tower_retry_safety::peek::PeekBodyMiddleware;
/// use tower_retry_safety::{FailureClass, RetryPolicy, RetrySafetyMiddleware};
///
/// let client = ClientBuilder::new(reqwest::Client::new())
///     .with(RetrySafetyMiddleware::new(RetryPolicy::builder().build()?))
///     // This API answers 200 with `"error":"rate_limited"` before it runs anything.
///     .with(PeekBodyMiddleware::new(4096, |_status, _headers, body: &[u8]| {
///         let limited = body.windows(14).any(|w| w == b"\"rate_limited\"");
///         limited.then_some(FailureClass::NotSent)
///     }))
///     .build();
/// # drop(client);
/// # Ok::<(), tower_retry_safety::BuildError>(())
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest-middleware")))]
#[derive(Clone, Debug)]
pub struct PeekBodyMiddleware {
    classifier: Arc<Classifier>,
}

impl PeekBodyMiddleware {
    /// As [`PeekBodyLayer::new`](crate::peek::PeekBodyLayer::new).
    pub fn new<F>(limit: usize, classify: F) -> Self
    where
        F: Fn(StatusCode, &HeaderMap, &[u8]) -> Option<FailureClass> + Send + Sync + 'static,
    {
        PeekBodyMiddleware {
            classifier: Arc::new(Classifier::new(limit, classify)),
        }
    }

    /// As [`PeekBodyLayer::when`](crate::peek::PeekBodyLayer::when).
    pub fn when<F>(self, when: F) -> Self
    where
        F: Fn(StatusCode, &HeaderMap) -> bool + Send + Sync + 'static,
    {
        let classifier = Classifier::clone(&self.classifier).when(when);
        PeekBodyMiddleware {
            classifier: Arc::new(classifier),
        }
    }
}

#[async_trait::async_trait]
impl Middleware for PeekBodyMiddleware {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let res = next.run(req, extensions).await?;
        if !self
            .classifier
            .wants(res.status(), res.headers(), res.content_length())
        {
            return Ok(res);
        }
        let url = res.url().clone();
        let (mut parts, body) = http::Response::<reqwest::Body>::from(res).into_parts();
        let (body, class) = self
            .classifier
            .read(parts.status, &parts.headers, body)
            .await;
        if let Some(class) = class {
            BodyVerdict::add(&mut parts.extensions, class);
        }
        // reqwest keeps a response's URL in an extension of its own: put it back.
        if let Ok(with_url) = http::Response::builder().url(url).body(()) {
            parts.extensions.extend(with_url.into_parts().0.extensions);
        }
        let res = http::Response::from_parts(parts, reqwest::Body::wrap(body));
        Ok(Response::from(res))
    }
}
