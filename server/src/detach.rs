//! A future that, dropped before it is done, finishes on the runtime instead of ending: the
//! keyed call, when the request that waits for it goes away.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

/// A future that, dropped before it is done, finishes on the runtime instead of ending.
pub(crate) struct DetachOnDrop<F: Future + Send + 'static>
where
    F::Output: Send,
{
    rest: Option<Pin<Box<F>>>,
    /// Set while the inner future is polled: still set at drop, it panicked, and is dropped
    /// rather than resumed (its guard then keeps the key).
    polling: bool,
}

impl<F: Future + Send + 'static> Future for DetachOnDrop<F>
where
    F::Output: Send,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        let Some(fut) = this.rest.as_mut() else {
            // Polled after it completed: a contract violation by the caller.
            return Poll::Pending;
        };
        this.polling = true;
        let out = fut.as_mut().poll(cx);
        this.polling = false;
        let out = ready!(out);
        this.rest = None;
        Poll::Ready(out)
    }
}

impl<F: Future + Send + 'static> Drop for DetachOnDrop<F>
where
    F::Output: Send,
{
    fn drop(&mut self) {
        if self.polling {
            return;
        }
        if let Some(rest) = self.rest.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn(rest)),
                Err(_) => tracing::warn!(
                    "a keyed call was dropped outside a tokio runtime: it ends unfinished, and its key stays in flight until its lease ends"
                ),
            }
        }
    }
}

impl<F: Future + Send + 'static> DetachOnDrop<F>
where
    F::Output: Send,
{
    pub(crate) fn new(future: F) -> Self {
        DetachOnDrop {
            rest: Some(Box::pin(future)),
            polling: false,
        }
    }
}
