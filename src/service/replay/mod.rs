//! The replay buffer: streaming request bodies recorded as they are sent, so that a retry can
//! send them again.
//!
//! A body that cannot be copied ([`ReplayBody::try_clone_body`](crate::service::ReplayBody) gives
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
//!
//! # Glossary
//!
//! - **recording** (`Recording`): one request's recorded body, shared by the layer and the
//!   bodies of its attempts: the limit, the [flags](tape) known so far, and the tape's home.
//! - **tape** (`Tape`): what was recorded so far, and the caller's body from where the last
//!   attempt stopped reading it. It moves into the body of the attempt that sends it, and back
//!   **home** (`Home`) when that body is dropped; the layer waits there for it.
//! - **playback** (`Playback`): one attempt's body: the tape played from its start, then the
//!   caller's body, recorded as it goes, then the recorded trailers.
//! - **replays** (`Replays`): the layer's handle on the recording, which makes each next
//!   attempt's body. It names only the body type the inner service takes (`NextBody`, made
//!   by `WrappedRecording` and changed by `Mapped`); a playback reaches its recording through
//!   a `RecordingHandle`, which names only the caller's body type.
//! - **kept** (`Kept`): what the layer keeps to send a body again: a copy, or replays.

mod body;
mod recorded;
mod tape;

pub(crate) use crate::attempts::NotReplayable;
pub use body::Replayable;
pub(crate) use recorded::Replays;
pub use recorded::{Recorded, ReplayBuffer};
