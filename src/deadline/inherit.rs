//! A future that runs in the deadline of the task that made it: for a task a handler spawns,
//! which a task-local does not follow (as `tracing`'s `in_current_span` is for spans).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::task::futures::TaskLocalFuture;

use super::Inbound;

/// Runs a future in the inbound deadline of the task that made it, wherever it is polled.
///
/// ```
/// use std::time::Duration;
/// use tower_retry_safety::deadline::{self, InheritDeadline, Inbound};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// deadline::scope(Inbound::within(Duration::from_millis(250)), async {
///     // A spawned task does not inherit a task-local: this one does, in one call.
///     let seen = tokio::spawn(async { deadline::current() }.in_current_deadline())
///         .await
///         .expect("the task ran");
///     assert!(seen.is_some());
/// })
/// .await;
/// # }
/// ```
pub trait InheritDeadline: Future + Sized {
    /// This future, run in [`current`](super::current)'s deadline as it is now (or in none,
    /// outside a scope).
    fn in_current_deadline(self) -> InCurrentDeadline<Self> {
        let state = match super::current() {
            Some(inbound) => State::Scoped {
                future: super::scope(inbound, self),
            },
            None => State::Plain { future: self },
        };
        InCurrentDeadline { state }
    }
}

impl<F: Future> InheritDeadline for F {}

pin_project! {
    /// The future of [`InheritDeadline::in_current_deadline`].
    pub struct InCurrentDeadline<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // Made inside a deadline's scope: run in it.
        Scoped { #[pin] future: TaskLocalFuture<Inbound, F> },
        // Made outside any: run as it is.
        Plain { #[pin] future: F },
    }
}

impl<F: Future> Future for InCurrentDeadline<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        match self.project().state.project() {
            StateProj::Scoped { future } => future.poll(cx),
            StateProj::Plain { future } => future.poll(cx),
        }
    }
}

impl<F> std::fmt::Debug for InCurrentDeadline<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InCurrentDeadline").finish_non_exhaustive()
    }
}
