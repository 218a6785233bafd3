//! The replay buffer: streaming request bodies recorded as they are sent, so that a retry can
//! send them again.
//!
//! A body that cannot be copied ([`ReplayBody::try_clone_body`](crate::ReplayBody) gives
//! `None`) is recorded when the request may be retried and the policy's
//! [`replay_buffer`](crate::RetryPolicyBuilder::replay_buffer) is on. The first attempt
//! streams it normally; the recording keeps each data chunk sent (a handle to the caller's
//! chunk, no copy) and the trailers. A retry replays the recording and then continues with
//! the caller's body from where the last attempt stopped reading, so an upload cut in the
//! middle can be retried. The request stops being retryable, and its report says why
//! ([`NotReplayable`]), when:
//!
//! - its size hint is over the limit before it is sent (it is not recorded at all), or it
//!   streams past the limit (the recording is dropped at once; the attempt goes on streaming);
//! - the response arrived before the body was sent to its end;
//! - reading the caller's body failed.
//!
//! The recording is freed when the request's future ends (or, if the transport is still
//! sending the last attempt's body then, as soon as that attempt has sent it).

mod body;
mod kept;
mod recorded;
mod refusal;
mod tape;

pub use body::Replayable;
pub(crate) use kept::{keep_stream, Kept, LET_GO_WAIT};
pub(crate) use recorded::Replays;
pub use recorded::{Recorded, ReplayBuffer};
pub use refusal::NotReplayable;
