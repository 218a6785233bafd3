//! Response bodies as part of the attempt, in a reqwest-middleware stack.

use std::convert::Infallible;

use http::header::CONTENT_LENGTH;
use http::{Extensions, HeaderMap};
use http_body_util::combinators::MapErr;
use http_body_util::BodyExt;
use reqwest::{Request, Response, ResponseBuilderExt};
use reqwest_middleware::{Middleware, Next};

use crate::box_error::BoxError;
use crate::resume::future::ResponseFuture;
use crate::resume::resumer::{Again, SendRange};
use crate::resume::ReadPlan;
use crate::resume::{NoResume, DEFAULT_READ_LIMIT};

/// A reqwest body whose errors never print the URL (a `reqwest::Error` does, query string
/// included).
type Inner = MapErr<reqwest::Body, fn(reqwest::Error) -> reqwest::Error>;

fn without_url(err: reqwest::Error) -> reqwest::Error {
    err.without_url()
}

/// [`ReadWholeLayer`](crate::resume::ReadWholeLayer) for reqwest-middleware. Add it after
/// [`RetrySafetyMiddleware`](crate::reqwest::RetrySafetyMiddleware), so that it runs on every attempt:
/// a body whose length is known to be within the limit is read inside the attempt, and a cut
/// is a failed attempt that the retry middleware recovers as the decision model allows (read
/// again; a keyed write sent again with the same key; an unkeyed write never sent again, its
/// body ending in a [`BodyCutError`](crate::resume::BodyCutError)).
///
/// A longer `GET` body streams to the caller, and with [`resume_with`](Self::resume_with) a
/// cut there asks for the rest with `Range` + `If-Range`, through the client given (the
/// middlewares after this one do not see the range requests); a keyed write is sent again
/// whole with its key, and continues only on the same response, stored by the server. The
/// report of the resumes is in [`BodyReport::of_reqwest`](crate::resume::BodyReport::of_reqwest). Ranges count encoded bytes: a
/// response that reqwest decoded (it then drops the `content-length`) is not resumed. The response stays a
/// `reqwest::Response` with its URL, status, headers and extensions.
///
/// ```
/// use reqwest_middleware::ClientBuilder;
/// use tower_retry_safety::resume::ReadWholeMiddleware;
/// use tower_retry_safety::{RetryPolicy, RetrySafetyMiddleware};
///
/// let client = reqwest::Client::new();
/// let with_retries = ClientBuilder::new(client.clone())
///     .with(RetrySafetyMiddleware::new(RetryPolicy::builder().build()?))
///     .with(ReadWholeMiddleware::new().resume_with(client))
///     .build();
/// # drop(with_retries);
/// # Ok::<(), tower_retry_safety::BuildError>(())
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest-middleware")))]
#[derive(Clone, Debug)]
pub struct ReadWholeMiddleware {
    limit: u64,
    client: Option<reqwest::Client>,
}

impl ReadWholeMiddleware {
    /// Reads bodies of a known length up to 64 KiB inside the attempt; no range resumes.
    pub fn new() -> Self {
        ReadWholeMiddleware {
            limit: DEFAULT_READ_LIMIT,
            client: None,
        }
    }

    /// As [`ReadWholeLayer::limit`](crate::resume::ReadWholeLayer::limit). Defaults to 64 KiB.
    ///
    /// ```
    /// let read = tower_retry_safety::resume::ReadWholeMiddleware::new().limit(16 * 1024);
    /// # drop(read);
    /// ```
    pub fn limit(mut self, limit: u64) -> Self {
        self.limit = limit;
        self
    }

    /// Resumes `GET` bodies past the limit with range requests sent through `client` (and
    /// keyed writes' bodies with the server's stored response).
    /// Defaults to none: a cut past the limit ends the body with the error.
    ///
    /// ```
    /// let read = tower_retry_safety::resume::ReadWholeMiddleware::new().resume_with(reqwest::Client::new());
    /// # drop(read);
    /// ```
    pub fn resume_with(mut self, client: reqwest::Client) -> Self {
        self.client = Some(client);
        self
    }
}

impl Default for ReadWholeMiddleware {
    fn default() -> Self {
        ReadWholeMiddleware::new()
    }
}

#[async_trait::async_trait]
impl Middleware for ReadWholeMiddleware {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let plan = ReadPlan::of(req.method(), req.headers(), extensions, self.limit);
        let again = match (&self.client, plan.resend) {
            (_, false) => Err(NoResume::NotRepeatable),
            (None, true) => Err(NoResume::NoSender),
            (Some(client), true) => req
                .try_clone()
                .map(|copy| Again {
                    send: sender(client.clone(), copy),
                    keyed_write: plan.keyed_write,
                })
                .ok_or(NoResume::NotRepeatable),
        };
        let res = next.run(req, extensions).await?;
        // Ranges count encoded bytes. A client that decodes (reqwest's `gzip`, `brotli`…
        // features) drops the response's content-length along with its content-encoding: the
        // bytes the caller gets are then not the ones a range would count from.
        let again = match again {
            Ok(_) if !res.headers().contains_key(CONTENT_LENGTH) => Err(NoResume::NoValidator),
            again => again,
        };
        let url = res.url().clone();
        let res = http::Response::<reqwest::Body>::from(res).map(inner);
        let ready = std::future::ready(Ok::<_, Infallible>(res));
        let res = match ResponseFuture::new(ready, plan.limit, again, plan.clock).await {
            Ok(res) => res,
            Err(never) => match never {},
        };
        let (mut parts, body) = res.into_parts();
        // reqwest keeps a response's URL in an extension of its own: put it back.
        if let Ok(with_url) = http::Response::builder().url(url).body(()) {
            parts.extensions.extend(with_url.into_parts().0.extensions);
        }
        let res = http::Response::from_parts(parts, reqwest::Body::wrap(body));
        Ok(Response::from(res))
    }
}

fn inner(body: reqwest::Body) -> Inner {
    body.map_err(without_url as fn(reqwest::Error) -> reqwest::Error)
}

/// What sends a copy of the request again, with more headers, through `client`.
fn sender(client: reqwest::Client, copy: Request) -> SendRange<Inner> {
    Box::new(move |more: HeaderMap| {
        let again = copy.try_clone();
        let client = client.clone();
        Box::pin(async move {
            let mut again = again.ok_or("the request could not be copied")?;
            again.headers_mut().extend(more);
            let res = client
                .execute(again)
                .await
                .map_err(|e| Box::new(e.without_url()) as BoxError)?;
            Ok(http::Response::<reqwest::Body>::from(res).map(inner))
        })
    })
}
