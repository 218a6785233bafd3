use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::BoxError;

pin_project! {
    /// The response body of [`IdempotencyService`](super::IdempotencyService): a buffered body
    /// (stored, replayed, or an answer of the layer's own) or the inner service's body,
    /// possibly after a prefix the layer already read while trying to buffer it.
    #[derive(Debug)]
    pub struct ResponseBody<B> {
        #[pin]
        inner: Inner<B>,
    }
}

pin_project! {
    #[project = Proj]
    #[derive(Debug)]
    enum Inner<B> {
        Buffered { data: Option<Bytes> },
        Stream { prefix: Option<Bytes>, trailers: Option<HeaderMap>, #[pin] rest: B },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn full(data: impl Into<Bytes>) -> Self {
        let data: Bytes = data.into();
        ResponseBody {
            inner: Inner::Buffered {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }

    /// The inner body, after `prefix` (and `trailers`, if reading for the buffer already met
    /// them).
    pub(crate) fn stream(prefix: Bytes, trailers: Option<HeaderMap>, rest: B) -> Self {
        ResponseBody {
            inner: Inner::Stream {
                prefix: (!prefix.is_empty()).then_some(prefix),
                trailers,
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
            Proj::Buffered { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            Proj::Stream {
                prefix,
                trailers,
                rest,
            } => {
                if let Some(prefix) = prefix.take() {
                    return Poll::Ready(Some(Ok(Frame::data(prefix))));
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
            Inner::Buffered { data } => data.is_none(),
            Inner::Stream {
                prefix,
                trailers,
                rest,
            } => prefix.is_none() && trailers.is_none() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Buffered { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Inner::Stream { prefix, rest, .. } => {
                let extra = prefix.as_ref().map_or(0, |p| p.len() as u64);
                let inner = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(inner.lower() + extra);
                if let Some(upper) = inner.upper() {
                    hint.set_upper(upper + extra);
                }
                hint
            }
        }
    }
}
