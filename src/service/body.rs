use bytes::{Buf, Bytes};
use http_body_util::{BodyStream, Either, Empty, Full, StreamBody};

/// A request body the layer can send again.
///
/// The layer keeps a copy of each request it may retry. Bodies that are cheap to copy
/// (`Full<Bytes>`, `Empty<Bytes>`, `String`, `Vec<u8>`, `Bytes`, `()`, `&'static str`) return
/// `Some`. Streaming bodies (`hyper::body::Incoming`, `BoxBody`, `UnsyncBoxBody`, a channel or
/// `StreamBody`) return `None`: the request still goes through the layer, is sent exactly once
/// and is never refused before sending, and its report says
/// [`StopReason::BodyNotReplayable`](crate::StopReason::BodyNotReplayable).
///
/// Implement it for your own body type: return a copy that yields the same bytes, or `None`.
///
/// ```
/// use bytes::Bytes;
/// use tower_retry_safety::ReplayBody;
///
/// /// A JSON body kept as bytes: copies share them.
/// #[derive(Clone)]
/// struct Json(Bytes);
///
/// impl ReplayBody for Json {
///     fn try_clone_body(&self) -> Option<Self> {
///         Some(self.clone())
///     }
/// }
/// ```
pub trait ReplayBody: Sized {
    /// A body that sends the same bytes again, or `None` if this body cannot be replayed.
    fn try_clone_body(&self) -> Option<Self>;
}

macro_rules! replay_by_clone {
    ($($ty:ty),* $(,)?) => {$(
        impl ReplayBody for $ty {
            fn try_clone_body(&self) -> Option<Self> {
                Some(self.clone())
            }
        }
    )*};
}

replay_by_clone!(String, Vec<u8>, Bytes, (), &'static str, &'static [u8]);

impl<D: Buf + Clone> ReplayBody for Full<D> {
    fn try_clone_body(&self) -> Option<Self> {
        Some(self.clone())
    }
}

impl<D> ReplayBody for Empty<D> {
    fn try_clone_body(&self) -> Option<Self> {
        Some(Empty::new())
    }
}

impl<L: ReplayBody, R: ReplayBody> ReplayBody for Either<L, R> {
    fn try_clone_body(&self) -> Option<Self> {
        match self {
            Either::Left(l) => l.try_clone_body().map(Either::Left),
            Either::Right(r) => r.try_clone_body().map(Either::Right),
        }
    }
}

macro_rules! never_replay {
    ($( [$($gen:tt)*] $ty:ty ),* $(,)?) => {$(
        impl<$($gen)*> ReplayBody for $ty {
            /// A stream is consumed as it is sent: it cannot be replayed.
            fn try_clone_body(&self) -> Option<Self> {
                None
            }
        }
    )*};
}

never_replay!(
    [] hyper::body::Incoming,
    [D, E] http_body_util::combinators::BoxBody<D, E>,
    [D, E] http_body_util::combinators::UnsyncBoxBody<D, E>,
    [D, E] http_body_util::channel::Channel<D, E>,
    [S] StreamBody<S>,
    [B] BodyStream<B>,
);
