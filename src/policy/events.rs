//! A hook for metrics: one event per attempt, with what was decided after it.

use std::fmt;
use std::sync::Arc;

use http::{Method, StatusCode};

use super::Decision;
use crate::classify::{FailureClass, VerdictSource};

/// What happened to one attempt, and what the policy decided after it: the material for
/// metrics (attempts, retries by class, suppressed writes, budget and deadline refusals,
/// bodies that could not be replayed) without writing a tracing layer. See
/// [`RetryPolicyBuilder::on_attempt`](crate::RetryPolicyBuilder::on_attempt).
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

/// Logs once per policy that a request's host was not visible to host-scoped settings: every
/// such request is classified failing closed, and saying so per request would flood the log.
#[cold]
pub(crate) fn host_unknown(warned: &std::sync::atomic::AtomicBool, method: &Method, path: &str) {
    if warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    tracing::warn!(
        %method,
        path = crate::target::cap(path, crate::target::MAX_PATH_LEN),
        "retry policy: a request shows no host (no host in its URI, no Host header), so rules \
         and key trust scoped to hosts were applied failing closed (a host-scoped NonIdempotent \
         rule holds, host-scoped Idempotent rules and key trust do not); give the layer its \
         origin with RetryPolicy::for_origin (logged once per policy)"
    );
}
