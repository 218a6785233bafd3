//! tonic's request body as a [`ReplayBody`].

use crate::classify::StackErrors;
use crate::service::Replayable;
use crate::service::{Recorded, ReplayBody, ReplayBuffer};

/// tonic's `Body` (feature `tonic`) is a stream of encoded messages: recorded as it is sent,
/// within the policy's [`replay_buffer`](crate::RetryPolicyBuilder::replay_buffer), so the
/// layer sits directly on a `tonic::transport::Channel`. A unary call's one message and a
/// client stream that fits are replayed; a stream past the buffer is sent once and its
/// report says [`NotReplayable`](crate::attempts::NotReplayable).
impl ReplayBody for tonic::body::Body {
    /// An empty body is copied; any other is a stream, recorded.
    fn try_clone_body(&self) -> Option<Self> {
        http_body::Body::is_end_stream(self).then(tonic::body::Body::empty)
    }

    fn record(self, buffer: &ReplayBuffer) -> Recorded<Self> {
        Recorded::stream(self, buffer, tonic::body::Body::new::<Replayable<Self>>)
    }

    /// A `Channel`'s errors: tonic's `ConnectError` is not sent, its `TimeoutExpired` a timeout.
    fn stack_errors() -> &'static StackErrors {
        &super::errors::TONIC
    }
}
