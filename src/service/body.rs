use bytes::{Buf, Bytes};
use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
use http_body_util::{BodyStream, Either, Empty, Full, StreamBody};

use super::replay::{Recorded, ReplayBuffer, Replayable};
use crate::classify::StackErrors;

/// A request body the layer can send again.
///
/// The layer keeps a copy of each request it may retry. Bodies that are cheap to copy
/// (`Full<Bytes>`, `Empty<Bytes>`, `String`, `Vec<u8>`, `Bytes`, `()`, `&'static str`) return
/// `Some`. Streaming bodies return `None`; of those, `BoxBody`, `UnsyncBoxBody` and
/// [`Replayable`](crate::service::Replayable) are recorded as they stream, up to the policy's
/// [`replay_buffer`](crate::RetryPolicyBuilder::replay_buffer), so that a retry can replay
/// them ([`record`](Self::record)). Other streams (`hyper::body::Incoming`, a channel,
/// `StreamBody`: wrap them in [`Replayable`](crate::service::Replayable) to have them recorded) still go through the
/// layer, are sent exactly once and are never refused before sending, and their report says
/// [`StopReason::BodyNotReplayable`](crate::policy::StopReason::BodyNotReplayable).
///
/// A body type that is neither is refused at compile time, with a message that names
/// [`Replayable::new`](crate::service::Replayable::new) and the bodies that work. rustc shows that message where it
/// checks the bound itself (`Service::call`, a function that takes `impl Service<Request<B>>`);
/// through `ServiceExt::oneshot` or `ready` it reports only that the method's trait bounds
/// are not satisfied (E0599) by `RetrySafety<…>`: then the request body is the cause.
///
/// Implement it for your own body type: return a copy that yields the same bytes, or `None`;
/// a streaming type can also record itself with [`Recorded::stream`].
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
#[diagnostic::on_unimplemented(
    message = "the retry layer cannot send a `{Self}` request body again",
    label = "this body type is not a `ReplayBody`",
    note = "wrap a streaming body in `tower_retry_safety::service::Replayable::new(body)` and build the client for `Replayable<{Self}>`; it is then recorded up to the policy's `replay_buffer` for retries",
    note = "bodies that work as they are: `Full<Bytes>`, `Empty<Bytes>`, `Bytes`, `String`, `Vec<u8>`, `BoxBody`, `UnsyncBoxBody`, `hyper::body::Incoming` (sent once), `reqwest::Body` (feature `reqwest-middleware`), `axum::body::Body` (feature `axum`) and `tonic::body::Body` (feature `tonic`)"
)]
pub trait ReplayBody: Sized {
    /// A body that sends the same bytes again, or `None` if this body cannot be copied.
    fn try_clone_body(&self) -> Option<Self>;

    /// Makes a body that cannot be copied ready to be recorded as it streams, so that a retry
    /// can replay it (see [`Replayable`](crate::service::Replayable)). Called only when the request may be retried and
    /// the policy's replay buffer is on. Defaults to [`Recorded::once`]: the body is sent
    /// once. `BoxBody`, `UnsyncBoxBody`, [`Replayable`](crate::service::Replayable) and (with their
    /// features) `reqwest::Body`, axum's and tonic's `Body` record themselves with
    /// [`Recorded::stream`].
    fn record(self, buffer: &ReplayBuffer) -> Recorded<Self> {
        let _ = buffer;
        Recorded::once(self)
    }

    /// The errors of the client stack this body's requests go down that only its front end
    /// can name, read before the types this crate knows (see [`StackErrors`]). Defaults to
    /// [`StackErrors::NONE`]; tonic's `Body` (feature `tonic`) brings tonic's `ConnectError`
    /// (not sent) and `TimeoutExpired` (a timeout), and `Either` the side that names any. A
    /// body type of your own that wraps tonic's forwards it (`tonic::body::Body::stack_errors()`);
    /// one that does not only loses retries: an error nothing names is ambiguous.
    fn stack_errors() -> &'static StackErrors {
        &StackErrors::NONE
    }
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

impl<L, R> ReplayBody for Either<L, R>
where
    L: ReplayBody + 'static,
    R: ReplayBody + 'static,
{
    fn try_clone_body(&self) -> Option<Self> {
        match self {
            Either::Left(l) => l.try_clone_body().map(Either::Left),
            Either::Right(r) => r.try_clone_body().map(Either::Right),
        }
    }

    fn record(self, buffer: &ReplayBuffer) -> Recorded<Self> {
        match self {
            Either::Left(l) => l.record(buffer).map(Either::Left),
            Either::Right(r) => r.record(buffer).map(Either::Right),
        }
    }

    /// The side whose stack names errors of its own (tonic's `Body` on either side).
    fn stack_errors() -> &'static StackErrors {
        let left = L::stack_errors();
        if left.reads_errors() {
            left
        } else {
            R::stack_errors()
        }
    }
}

impl<D, E> ReplayBody for BoxBody<D, E>
where
    D: Buf + Clone + Send + Sync + 'static,
    E: 'static,
{
    /// A stream: not copied, recorded (see [`Replayable`](crate::service::Replayable)).
    fn try_clone_body(&self) -> Option<Self> {
        None
    }

    fn record(self, buffer: &ReplayBuffer) -> Recorded<Self> {
        Recorded::stream(self, buffer, BoxBody::new)
    }
}

impl<D, E> ReplayBody for UnsyncBoxBody<D, E>
where
    D: Buf + Clone + Send + 'static,
    E: 'static,
{
    /// A stream: not copied, recorded (see [`Replayable`](crate::service::Replayable)).
    fn try_clone_body(&self) -> Option<Self> {
        None
    }

    fn record(self, buffer: &ReplayBuffer) -> Recorded<Self> {
        Recorded::stream(self, buffer, UnsyncBoxBody::new)
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

/// A body wrapped to be recorded: the caller's is recorded as it streams; one that is already
/// an attempt's view of a recording (an outer layer's) is sent as it is.
impl<B> ReplayBody for Replayable<B>
where
    B: http_body::Body + Unpin + Send + 'static,
    B::Data: Clone + Send,
{
    /// A stream: not copied, recorded.
    fn try_clone_body(&self) -> Option<Self> {
        None
    }

    fn record(self, buffer: &ReplayBuffer) -> Recorded<Self> {
        match self.into_callers() {
            Ok(body) => Recorded::stream(body, buffer, |replay| replay),
            // Already an attempt's view of a recording (an outer layer's): sent as it is.
            Err(recorded) => Recorded::once(recorded),
        }
    }
}

never_replay!(
    [] hyper::body::Incoming,
    [D, E] http_body_util::channel::Channel<D, E>,
    [S] StreamBody<S>,
    [B] BodyStream<B>,
);

/// axum's `Body` (feature `axum`) is a stream: recorded as it is sent, as `BoxBody` is, so a
/// client or proxy built for it can retry with it.
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl ReplayBody for axum_core::body::Body {
    /// A stream: not copied, recorded (see [`Replayable`](crate::service::Replayable)).
    fn try_clone_body(&self) -> Option<Self> {
        None
    }

    fn record(self, buffer: &ReplayBuffer) -> Recorded<Self> {
        Recorded::stream(
            self,
            buffer,
            axum_core::body::Body::new::<Replayable<axum_core::body::Body>>,
        )
    }
}
