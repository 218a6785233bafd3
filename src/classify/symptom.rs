//! How an ambiguous attempt failed, in words a caller understands: the error's message says
//! "timed out" or "connection lost" from it.

use std::error::Error as StdError;

use super::failure::{chain, StackErrors};
use crate::timed_out::TimedOut;

/// How an ambiguous attempt failed, in words a caller understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Symptom {
    Timeout,
    ConnectionLost,
    Other,
}

impl Symptom {
    /// `stack` names the timeouts of the client stack's own error types.
    pub(crate) fn of(err: &(dyn StdError + 'static), stack: &StackErrors) -> Symptom {
        chain(err)
            .find_map(|e| {
                if (stack.timed_out)(e) {
                    return Some(Symptom::Timeout);
                }
                Symptom::of_one(e)
            })
            .unwrap_or(Symptom::Other)
    }

    fn of_one(err: &(dyn StdError + 'static)) -> Option<Symptom> {
        if err.is::<tower::timeout::error::Elapsed>() || err.is::<TimedOut>() {
            return Some(Symptom::Timeout);
        }
        if let Some(e) = err.downcast_ref::<hyper::Error>() {
            if e.is_timeout() {
                return Some(Symptom::Timeout);
            }
            if e.is_incomplete_message() {
                return Some(Symptom::ConnectionLost);
            }
        }
        #[cfg(feature = "reqwest-middleware")]
        if let Some(e) = err.downcast_ref::<reqwest::Error>() {
            if e.is_timeout() {
                return Some(Symptom::Timeout);
            }
        }
        if let Some(e) = err.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            match e.kind() {
                TimedOut => return Some(Symptom::Timeout),
                ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof => {
                    return Some(Symptom::ConnectionLost)
                }
                _ => {}
            }
        }
        None
    }
}
