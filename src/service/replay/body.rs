use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};

use super::tape::Playback;

/// A streaming request body that the layer can send again: build your client for
/// `Replayable<B>` and wrap each request's body in it.
///
/// The first attempt streams the body as it comes while the layer keeps each chunk it sends
/// (the chunk's own handle, not a copy), up to the policy's
/// [`replay_buffer`](crate::RetryPolicyBuilder::replay_buffer). A retry replays what was kept
/// and then goes on reading the caller's body where the last attempt stopped. Past the limit
/// the kept chunks are dropped at once, the attempt goes on streaming, and the request is not
/// retried again.
///
/// Clients built for `BoxBody` or `UnsyncBoxBody` need no wrapper: the layer records those
/// and hands the replay on boxed. Use `Replayable` for other streaming types, such as a
/// proxy's `hyper::body::Incoming` left unboxed. A body that is not `Unpin` can be wrapped
/// after `Box::pin`.
///
/// ```
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use std::sync::Arc;
/// use std::time::Duration;
/// use bytes::Bytes;
/// use http_body::Frame;
/// use http_body_util::{BodyExt, StreamBody};
/// use tower::{service_fn, Layer, ServiceExt};
/// use tower_retry_safety::service::Replayable;
/// use tower_retry_safety::{RetryPolicy, RetryReport};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// // An upload streamed in chunks, as a proxied request or a file would be.
/// let chunks: Vec<Result<_, std::io::Error>> =
///     vec![Ok(Frame::data(Bytes::from("hello "))), Ok(Frame::data(Bytes::from("world")))];
/// let body = Replayable::new(StreamBody::new(futures_util::stream::iter(chunks)));
///
/// // A service whose first attempt reads the body, then loses its connection.
/// let calls = Arc::new(AtomicU32::new(0));
/// let svc = service_fn(move |req: http::Request<Replayable<_>>| {
///     let first = calls.fetch_add(1, Ordering::SeqCst) == 0;
///     async move {
///         let body = req.into_body().collect().await?.to_bytes();
///         assert_eq!(body, "hello world"); // on every attempt
///         if first {
///             return Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
///         }
///         Ok(http::Response::new(()))
///     }
/// });
/// let policy = RetryPolicy::builder()
///     .backoff(Duration::from_millis(1), Duration::from_millis(1))
///     .build()?;
/// let res = policy.layer(svc).oneshot(http::Request::put("/v1/files/1").body(body)?).await?;
/// assert_eq!(RetryReport::of(&res).unwrap().attempts(), 2);
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
/// ```
pub struct Replayable<B: Body> {
    inner: Inner<B>,
}

enum Inner<B: Body> {
    /// The caller's body, sent as it is (the layer did not record it).
    Caller(B),
    /// One attempt's view of the recording.
    Playback(Playback<B>),
}

impl<B: Body> Replayable<B> {
    /// Wraps a body so the layer can record it.
    pub fn new(body: B) -> Self {
        Replayable {
            inner: Inner::Caller(body),
        }
    }

    pub(crate) fn playing(player: Playback<B>) -> Self {
        Replayable {
            inner: Inner::Playback(player),
        }
    }

    /// The caller's body, if the layer has not recorded it yet; else itself (an attempt's view
    /// of a recording, an outer layer's).
    pub(crate) fn into_callers(self) -> Result<B, Self> {
        match self.inner {
            Inner::Caller(body) => Ok(body),
            inner => Err(Replayable { inner }),
        }
    }
}

// The recording moves between attempts' bodies, so nothing in it is pinned; the caller's body
// is polled pinned only when it is `Unpin` itself.
impl<B: Body> Unpin for Replayable<B> {}

impl<B> Body for Replayable<B>
where
    B: Body + Unpin,
    B::Data: Clone,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match &mut self.get_mut().inner {
            Inner::Caller(body) => Pin::new(body).poll_frame(cx),
            Inner::Playback(player) => player.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Caller(body) => body.is_end_stream(),
            Inner::Playback(player) => player.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Caller(body) => body.size_hint(),
            Inner::Playback(player) => player.size_hint(),
        }
    }
}

/// Says whether the layer records the body; never its content.
impl<B: Body> fmt::Debug for Replayable<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let recorded = matches!(self.inner, Inner::Playback(_));
        f.debug_struct("Replayable")
            .field("recorded", &recorded)
            .finish_non_exhaustive()
    }
}
