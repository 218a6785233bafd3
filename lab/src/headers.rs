//! The headers through which the [keys check](crate::keys::KeysCheck) asks a test deployment for
//! what it needs to see (an answer held, a handler that fails, a number per handler run);
//! the lab's [`Upstream`](crate::serve::Upstream) honours all three.

/// The response header that carries the handler run's number, unique per run: a stored
/// response repeats its run's number.
pub const RUN_HEADER: &str = "x-lab-handler-run";
/// A request header: the handler holds its answer this many milliseconds (at most a
/// minute), so that repeats overlap it.
pub const HOLD_HEADER: &str = "x-lab-hold-ms";
/// A request header: the handler fails (an error, after counting its run), as a handler
/// whose backend went away after it may have applied its effect.
pub const FAIL_HEADER: &str = "x-lab-fail";
