//! The error of an attempt that the policy's clock cut: its per-attempt timeout or the
//! request's deadline passed while the attempt was in flight.

use std::fmt;

/// Which clock cut the attempt. Either way the attempt may have reached the server: it is
/// ambiguous (an unknown error to the classifier, which never assumes a write did not happen).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TimedOut {
    /// The policy's (or the request's) per-attempt timeout.
    Attempt,
    /// The policy's (or the request's) total deadline.
    Deadline,
}

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TimedOut::Attempt => "the attempt timed out",
            TimedOut::Deadline => "the request's deadline passed while an attempt was in flight",
        })
    }
}

impl std::error::Error for TimedOut {}
