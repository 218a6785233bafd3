//! Deadlines that cross hops: the instant after which nobody waits for the answer, handed
//! from a caller to the services it calls, so that no hop starts work for a caller who has
//! already gone.
//!
//! A call often crosses several services: an SDK calls A, whose handler calls B, whose
//! handler calls C. Without a deadline on the wire each hop has only its own timeout, and
//! when C is slow the SDK gives up while A and B go on resending to C — work whose answer
//! nobody reads, and writes that land after the SDK was told "failed, may have been applied".
//!
//! - **On the wire.** A gRPC call carries the time the client waits for the attempt as
//!   `grpc-timeout` and, on a resend, `grpc-previous-rpc-attempts` (gRFC A6). An HTTP request
//!   carries them in two headers, but only to the hosts a policy names
//!   ([`send_deadline_to`](crate::RetryPolicyBuilder::send_deadline_to)), in the
//!   [`Convention`] each host's server reads (this crate's own [`TIMEOUT_HEADER`] and
//!   [`ATTEMPT_HEADER`] by default, Envoy's, or Connect's): a client does not send unknown
//!   headers to an API that did not ask for them. The time on the wire is how long the client
//!   waits for *that* attempt — the earlier of its attempt timeout and the deadline — when
//!   it is sent, rounded down: never longer than the client waits.
//! - **Redirects.** A redirect followed below the layer copies the request's headers: a
//!   stale time left, perhaps to a host that never asked. With reqwest, build the client
//!   with `RetrySafetyMiddleware::redirect_policy`
//!   (feature `reqwest-middleware`); with tower-http's `FollowRedirect`, put it *above* the
//!   policy's layer, so that each redirected request goes through the layer again and gets
//!   fresh values, and none for a host not named.
//! - **Inbound.** A server reads them (the server crate's deadline layer does), caps them by
//!   its own maximum, and runs the handler inside [`scope`] with the [`Inbound`] deadline.
//! - **Nested calls inherit it**, without glue: a policy's layer used inside that handler
//!   reads the deadline and never waits past it less a margin for the way back
//!   ([`inherit_deadline`](crate::RetryPolicyBuilder::inherit_deadline)); an attempt that
//!   cannot start before it is not sent, and the report says so
//!   ([`StopReason::CallerDeadline`](crate::policy::StopReason::CallerDeadline)). The deadline is
//!   read from the nested request's extensions (an [`Inbound`] put there), else from
//!   [`current`]: a call whose policy runs in another task — behind a
//!   `tower::buffer::Buffer`, whose worker calls the layer — carries it in the request:
//!   `req.extensions_mut().insert(inbound)`. A task the handler spawns does not inherit a
//!   task-local: spawn `future.in_current_deadline()` ([`InheritDeadline`]), as `tracing`'s
//!   `in_current_span` does for spans.
//! - **Retry at one layer**, on request: when the caller retries (its request carried an
//!   attempt number), a policy can spend fewer resends on nested calls, or none
//!   ([`retries_when_caller_retries`](crate::RetryPolicyBuilder::retries_when_caller_retries)),
//!   so that three hops with three retries each do not make 27 attempts.
//!
//! ```
//! use std::time::Duration;
//! use tower_retry_safety::deadline::{self, Inbound};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let inbound = Inbound::within(Duration::from_millis(250));
//! deadline::scope(inbound, async {
//!     // A handler's nested calls through a policy's layer see it.
//!     let seen = deadline::current().expect("inside the scope");
//!     assert!(seen.remaining() <= Duration::from_millis(250));
//! })
//! .await;
//! assert!(deadline::current().is_none());
//! # }
//! ```

mod convention;
mod inherit;
mod wire;

use std::future::Future;
use std::time::Duration;

use tokio::task::futures::TaskLocalFuture;
use tokio::time::Instant;

pub use convention::{
    Convention, CONNECT_TIMEOUT_HEADER, ENVOY_ATTEMPT_HEADER, ENVOY_TIMEOUT_HEADER,
};
pub use inherit::InheritDeadline;
pub(crate) use wire::timeout_value;
pub use wire::{
    parse_attempt, parse_grpc_timeout, parse_timeout_ms, BadDeadline, ATTEMPT_HEADER,
    TIMEOUT_HEADER,
};

/// The future of [`InheritDeadline::in_current_deadline`].
pub mod future {
    pub use super::inherit::InCurrentDeadline;
}

tokio::task_local! {
    static INBOUND: Inbound;
}

/// The deadline a request arrived with, as a server read it (already capped by its own
/// maximum), and whether its caller retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inbound {
    at: Instant,
    caller_retries: bool,
}

impl Inbound {
    /// A deadline at `at`.
    pub fn at(at: Instant) -> Self {
        Inbound {
            at,
            caller_retries: false,
        }
    }

    /// A deadline `timeout` from now (a far-off instant if it overflows).
    pub fn within(timeout: Duration) -> Self {
        let now = Instant::now();
        // About 30 years: what tokio's own far future is.
        let far = Duration::from_secs(86_400 * 365 * 30);
        Inbound::at(now.checked_add(timeout).unwrap_or(now + far))
    }

    /// Marks the caller as one that retries (its request carried an attempt number).
    pub fn with_caller_retries(mut self, caller_retries: bool) -> Self {
        self.caller_retries = caller_retries;
        self
    }

    /// When the caller stops waiting.
    pub fn deadline(&self) -> Instant {
        self.at
    }

    /// The time left before it (zero once it has passed).
    pub fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    /// Whether it has passed.
    pub fn has_passed(&self) -> bool {
        self.at <= Instant::now()
    }

    /// Whether the caller retries.
    pub fn caller_retries(&self) -> bool {
        self.caller_retries
    }
}

/// Runs `future` with `inbound` as the deadline that nested calls inherit ([`current`]).
pub fn scope<F: Future>(inbound: Inbound, future: F) -> TaskLocalFuture<Inbound, F> {
    INBOUND.scope(inbound, future)
}

/// Runs `f` with `inbound` as the deadline that nested calls inherit ([`current`]), for a
/// synchronous step: a body's `poll_frame` that may start a nested call while a server polls
/// a streamed response, after the handler's future has ended.
pub fn sync_scope<R>(inbound: Inbound, f: impl FnOnce() -> R) -> R {
    INBOUND.sync_scope(inbound, f)
}

/// The inbound deadline of the task this runs in, if a server set one with [`scope`].
#[inline]
pub fn current() -> Option<Inbound> {
    INBOUND.try_with(|inbound| *inbound).ok()
}
