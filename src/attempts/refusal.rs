use std::fmt;

/// Why a request's body could not be sent again, as its
/// [`RetryReport::body_not_replayable`](crate::attempts::RetryReport::body_not_replayable) says when
/// retries stopped with [`StopReason::BodyNotReplayable`](crate::policy::StopReason::BodyNotReplayable).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NotReplayable {
    /// A stream the layer does not record: its type has no replay (wrap it in
    /// [`Replayable`](crate::service::Replayable)), or the policy's replay buffer is off.
    Stream,
    /// The body is larger than the replay buffer: by its size hint before it was sent, or once
    /// it streamed past the limit, when the recording was dropped.
    OverLimit {
        /// The policy's [`replay_buffer`](crate::RetryPolicyBuilder::replay_buffer), in bytes.
        limit: usize,
    },
    /// The response arrived before the body had been sent to its end: the server answered
    /// without the whole body, and the rest may still have been on its way.
    ResponseBeforeEnd,
    /// The last attempt's transport still held the body when the retry was due.
    StillInUse,
    /// Reading the caller's body failed.
    BodyFailed,
}

impl NotReplayable {
    /// A short lowercase name, for logs and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            NotReplayable::Stream => "stream",
            NotReplayable::OverLimit { .. } => "over-limit",
            NotReplayable::ResponseBeforeEnd => "response-before-end",
            NotReplayable::StillInUse => "still-in-use",
            NotReplayable::BodyFailed => "body-failed",
        }
    }
}

impl fmt::Display for NotReplayable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotReplayable::Stream => f.write_str("its body is a stream that is not recorded"),
            NotReplayable::OverLimit { limit } => {
                write!(f, "its body is larger than the {limit}-byte replay buffer")
            }
            NotReplayable::ResponseBeforeEnd => {
                f.write_str("the response arrived before its body was sent to the end")
            }
            NotReplayable::StillInUse => {
                f.write_str("the last attempt still held its body when the retry was due")
            }
            NotReplayable::BodyFailed => f.write_str("reading its body failed"),
        }
    }
}
