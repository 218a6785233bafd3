//! A hook for metrics: one event per attempt, with what was decided after it.

use std::fmt;
use std::sync::Arc;

use http::{Method, StatusCode};

use super::Decision;
use crate::classify::{FailureClass, VerdictSource};

/// What happened to one attempt, and what the policy decided after it: the material for
/// metrics (attempts, retries by class, suppressed writes, budget and deadline refusals,
/// bodies that could not be replayed) without writing a tracing layer. See
/// [`RetryPolicyBuilder::on_attempt`](super::RetryPolicyBuilder::on_attempt).
///
/// Holds the method and path, never the query string, a header value or the body.
#[non_exhaustive]
#[derive(Clone, Copy, Debug)]
pub struct AttemptEvent<'a> {
    /// The request's method.
    pub method: &'a Method,
    /// The request's path, without query, capped at 256 bytes.
    pub path: &'a str,
    /// Which attempt this was: 1 for the first.
    pub attempt: u32,
    /// What is known about its outcome.
    pub class: FailureClass,
    /// Its response status, if it got a response.
    pub status: Option<StatusCode>,
    /// Which rule decided whether a repeat is harmless.
    pub verdict_source: VerdictSource,
    /// Retry (after a wait) or stop, and why.
    pub decision: Decision,
}

pub(crate) type AttemptHookFn = dyn Fn(&AttemptEvent<'_>) + Send + Sync;

/// The caller's hook, shared by the policy's clones.
#[derive(Clone)]
pub(crate) struct AttemptHook(pub(crate) Arc<AttemptHookFn>);

impl fmt::Debug for AttemptHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AttemptHook(..)")
    }
}
