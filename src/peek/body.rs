use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

/// A response body whose beginning was read to classify it: sends what was read, then the
/// rest of the original body (or the error that stopped the reading).
pub struct PeekedBody<B: Body> {
    /// Whether the original body's length was known: a body that streamed without one (and
    /// may carry trailers) must not be handed on as one of a known length.
    exact: bool,
    read: VecDeque<Bytes>,
    /// Bytes in `read`.
    read_len: u64,
    trailers: Option<HeaderMap>,
    rest: Option<B>,
    error: Option<B::Error>,
}

impl<B: Body> PeekedBody<B> {
    pub(crate) fn empty(exact: bool) -> Self {
        PeekedBody {
            exact,
            read: VecDeque::new(),
            read_len: 0,
            trailers: None,
            rest: None,
            error: None,
        }
    }

    /// A body that was not read: the original, as it is.
    pub(crate) fn unread(body: B) -> Self {
        PeekedBody::empty(true).then(body)
    }

    pub(crate) fn push_data(&mut self, chunk: Bytes) {
        self.read_len += chunk.len() as u64;
        self.read.push_back(chunk);
    }

    pub(crate) fn set_trailers(&mut self, trailers: HeaderMap) {
        self.trailers = Some(trailers);
    }

    pub(crate) fn then(mut self, rest: B) -> Self {
        self.rest = Some(rest);
        self
    }

    pub(crate) fn then_fail(mut self, error: B::Error) -> Self {
        self.error = Some(error);
        self
    }

    /// Calls `f` with the bytes read, in one slice (copied only if they came in more than one
    /// chunk).
    pub(crate) fn with_bytes<T>(&self, f: impl FnOnce(&[u8]) -> T) -> T {
        match self.read.len() {
            0 => f(&[]),
            1 => f(&self.read[0]),
            _ => {
                let mut all = BytesMut::with_capacity(self.read_len as usize);
                for chunk in &self.read {
                    all.extend_from_slice(chunk);
                }
                f(&all)
            }
        }
    }
}

impl<B> Body for PeekedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        if let Some(chunk) = this.read.pop_front() {
            this.read_len -= chunk.len() as u64;
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if let Some(err) = this.error.take() {
            return Poll::Ready(Some(Err(err)));
        }
        if let Some(rest) = this.rest.as_mut() {
            return Pin::new(rest).poll_frame(cx);
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
impl<B: Body> Unpin for PeekedBody<B> {}

/// Says how much was read; never the content.
impl<B: Body> fmt::Debug for PeekedBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeekedBody")
            .field("read_bytes", &self.read_len)
            .field("rest", &self.rest.is_some())
            .finish_non_exhaustive()
    }
}
