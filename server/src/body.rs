use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use tower_retry_safety::BoxError;

pin_project! {
    /// The response body of [`IdempotencyService`](crate::service::IdempotencyService): a buffered body
    /// (stored, sent again, or an answer of the layer's own) or the inner service's body,
    /// possibly after a prefix the layer already read while trying to buffer it.
    pub struct ResponseBody<B> {
        #[pin]
        inner: Inner<B>,
    }
}

pin_project! {
    #[project = Proj]
    enum Inner<B> {
        Buffered { data: Option<Bytes>, trailers: Option<HeaderMap> },
        // What was read, then the error that stopped the reading or the trailers it met, then
        // the rest of the inner body.
        Stream {
            prefix: Option<Bytes>,
            trailers: Option<HeaderMap>,
            error: Option<BoxError>,
            #[pin] rest: B,
        },
    }
}

/// Says what kind of body it is; never its content.
impl<B> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.inner {
            Inner::Buffered { .. } => "buffered",
            Inner::Stream { .. } => "stream",
        };
        f.debug_struct("ResponseBody")
            .field("kind", &kind)
            .finish_non_exhaustive()
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn full(data: impl Into<Bytes>) -> Self {
        Self::full_with_trailers(data.into(), None)
    }

    /// A buffered body that ends with `trailers`, if any.
    pub(crate) fn full_with_trailers(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        ResponseBody {
            inner: Inner::Buffered {
                data: (!data.is_empty()).then_some(data),
                trailers,
            },
        }
    }

    /// The inner body, after `prefix` (and `trailers`, if reading for the buffer already met
    /// them, or the `error` that ended the reading: the body ends there).
    pub(crate) fn stream(
        prefix: Bytes,
        trailers: Option<HeaderMap>,
        error: Option<BoxError>,
        rest: B,
    ) -> Self {
        ResponseBody {
            inner: Inner::Stream {
                prefix: (!prefix.is_empty()).then_some(prefix),
                trailers,
                error,
                rest,
            },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().inner.project() {
            Proj::Buffered { data, trailers } => Poll::Ready(
                data.take()
                    .map(Frame::data)
                    .or_else(|| trailers.take().map(Frame::trailers))
                    .map(Ok),
            ),
            Proj::Stream {
                prefix,
                trailers,
                error,
                rest,
            } => {
                if let Some(prefix) = prefix.take() {
                    return Poll::Ready(Some(Ok(Frame::data(prefix))));
                }
                if let Some(err) = error.take() {
                    return Poll::Ready(Some(Err(err)));
                }
                if let Some(trailers) = trailers.take() {
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                }
                rest.poll_frame(cx).map_err(Into::into)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Buffered { data, trailers } => data.is_none() && trailers.is_none(),
            Inner::Stream {
                prefix,
                trailers,
                error,
                rest,
            } => prefix.is_none() && trailers.is_none() && error.is_none() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Buffered { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Inner::Stream { prefix, rest, .. } => {
                // The rest's hint, moved up by the bytes read ahead of it.
                let ahead = prefix.as_ref().map_or(0, |p| p.len() as u64);
                let rest = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower().saturating_add(ahead));
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper.saturating_add(ahead));
                }
                hint
            }
        }
    }
}
