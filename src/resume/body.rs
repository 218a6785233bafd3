use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body::{Body, Frame, SizeHint};

use super::cut::BodyCutError;
use crate::BoxError;

/// A response body behind [`ReadWholeLayer`](crate::ReadWholeLayer): read whole inside the
/// attempt (then sent from memory), or streamed as it comes when it is longer than the limit.
/// A cut that was not recovered ends it with a [`BodyCutError`]; the transport's error is its
/// source.
pub struct WholeBody<B> {
    /// What was read inside the attempt, sent first.
    read: VecDeque<Bytes>,
    /// Bytes in `read`.
    read_len: u64,
    trailers: Option<HeaderMap>,
    /// The rest of the body, streamed as it comes.
    rest: Option<B>,
    /// The error that ends the body, after what was read.
    error: Option<BodyCutError>,
    /// Whether the body's length was known from the start.
    exact: bool,
    /// For a streamed rest: the response's status and the bytes received so far, to say where
    /// a cut happened.
    status: StatusCode,
    received: u64,
}

impl<B> WholeBody<B> {
    pub(crate) fn new(status: StatusCode, exact: bool) -> Self {
        WholeBody {
            read: VecDeque::new(),
            read_len: 0,
            trailers: None,
            rest: None,
            error: None,
            exact,
            status,
            received: 0,
        }
    }

    /// A body handed on unread: the original, streamed as it is.
    pub(crate) fn unread(status: StatusCode, body: B) -> Self {
        WholeBody::new(status, true).then(body)
    }

    pub(crate) fn push_data(&mut self, chunk: Bytes) {
        self.read_len += chunk.len() as u64;
        self.received += chunk.len() as u64;
        self.read.push_back(chunk);
    }

    pub(crate) fn set_trailers(&mut self, trailers: HeaderMap) {
        self.trailers = Some(trailers);
    }

    pub(crate) fn then(mut self, rest: B) -> Self {
        self.rest = Some(rest);
        self
    }

    pub(crate) fn then_fail(mut self, error: BodyCutError) -> Self {
        self.error = Some(error);
        self
    }

    /// Bytes received from the server so far (read inside the attempt, then streamed).
    pub(crate) fn received(&self) -> u64 {
        self.received
    }
}

impl<B> Body for WholeBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(chunk) = this.read.pop_front() {
            this.read_len -= chunk.len() as u64;
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if let Some(err) = this.error.take() {
            return Poll::Ready(Some(Err(Box::new(err))));
        }
        if let Some(rest) = this.rest.as_mut() {
            return match Pin::new(rest).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        this.received += data.len() as u64;
                    }
                    Poll::Ready(Some(Ok(frame)))
                }
                Poll::Ready(Some(Err(err))) => {
                    // Nothing more comes from a body that failed.
                    this.rest = None;
                    let cut = BodyCutError::new(this.status, this.received, err.into());
                    Poll::Ready(Some(Err(Box::new(cut))))
                }
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            };
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_empty()
            && self.error.is_none()
            && self.trailers.is_none()
            && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        crate::body_hint::with_bytes_ahead(self.rest.as_ref(), self.read_len, self.exact)
    }
}

// Nothing in it is pinned: the original body is polled pinned only when it is `Unpin`.
impl<B> Unpin for WholeBody<B> {}

/// Says how much was read; never the content.
impl<B> fmt::Debug for WholeBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WholeBody")
            .field("status", &self.status)
            .field("received", &self.received)
            .field("read_bytes", &self.read_len)
            .field("streaming", &self.rest.is_some())
            .field("cut", &self.error.is_some())
            .finish_non_exhaustive()
    }
}
