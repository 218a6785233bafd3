//! Keeping a claim alive: renewing its lease while the handler runs, and holding the key while
//! an outcome that the store refused is tried again. A claim whose lease lapses after its
//! handler ran would free the key, so neither may be left to chance.

use std::future::{poll_fn, Future};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::task::JoinHandle;
use tokio::time::{Instant, Sleep};

use super::run::Claimed;
use super::store::{IdempotencyStore, StoredResponse};
use crate::attempts::cap;

/// The timer for the first renewal, made before the handler is called: `Ok(None)` outside a
/// runtime (no renewal there), `Err` on a runtime without a timer (tokio panics making one),
/// where the claim can still be released because nothing ran.
pub(crate) fn first_renewal(lease: Duration) -> Result<Option<Sleep>, ()> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Ok(None);
    }
    std::panic::catch_unwind(AssertUnwindSafe(|| tokio::time::sleep(lease / 3)))
        .map(Some)
        .map_err(|_| ())
}

pin_project! {
    /// Keeps a claim's lease while its handler runs: if the work is still running when the
    /// first timer fires (a third of the lease), it renews the lease from a task of its own
    /// until the keeper is dropped. Most handlers end well before, and never pay for the task
    /// (nor for registering the timer: it is polled only once the work is pending).
    pub(crate) struct Keeper {
        #[pin]
        first: Option<Sleep>,
        renewing: Option<Renewing>,
    }
}

impl Keeper {
    pub(crate) fn new(first: Option<Sleep>) -> Self {
        Keeper {
            first,
            renewing: None,
        }
    }

    /// Stops renewing (the outcome is about to be stored: a renewal then would be refused).
    pub(crate) fn stop(self: Pin<&mut Self>) {
        *self.project().renewing = None;
    }

    /// Polls `work` to its end, renewing `claim`'s lease meanwhile. The work is borrowed,
    /// pinned where its owner keeps it: nothing is moved into this future.
    pub(crate) fn during<'a, St: IdempotencyStore, F: Future>(
        mut self: Pin<&'a mut Self>,
        claim: Option<&'a Claimed<St>>,
        mut work: Pin<&'a mut F>,
    ) -> impl Future<Output = F::Output> + 'a {
        poll_fn(move |cx| {
            if let Poll::Ready(out) = work.as_mut().poll(cx) {
                return Poll::Ready(out);
            }
            let this = self.as_mut().project();
            if this.renewing.is_none() {
                if let (Some(first), Some(c)) = (this.first.as_pin_mut(), claim) {
                    if first.poll(cx).is_ready() {
                        *this.renewing = Some(Renewing::start(c));
                    }
                }
            }
            Poll::Pending
        })
    }
}

/// Renews now, then every third of the lease; stops when dropped or when the claim was taken
/// over.
struct Renewing(Option<JoinHandle<()>>);

impl Renewing {
    fn start<St: IdempotencyStore>(c: &Claimed<St>) -> Self {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Renewing(None);
        };
        let (store, key, shown, claim, lease) = (
            c.store.clone(),
            c.key.clone(),
            c.shown.clone(),
            c.claim,
            c.config.lease,
        );
        Renewing(Some(runtime.spawn(async move {
            loop {
                if let Err(err) = store.renew(&key, claim, lease).await {
                    // Fenced: the lease ended (a store outage longer than it) and the key may
                    // have been claimed again; nothing to renew any more.
                    let fenced = err.is_fenced();
                    tracing::warn!(error = %err, cause = super::cause(&err), fenced, key = cap(&shown, 64), "idempotency claim not renewed");
                    if fenced {
                        return;
                    }
                }
                tokio::time::sleep(lease / 3).await;
            }
        })))
    }
}

impl Drop for Renewing {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// Holds the key in flight (renewing its lease) and, from a task of its own, tries to store
/// `record` again until it is stored, the claim is taken over (a store outage longer than the
/// lease), or the key's TTL has passed.
pub(crate) fn settle<St: IdempotencyStore>(c: Claimed<St>, record: StoredResponse) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(
            key = cap(&c.shown, 64),
            "idempotency outcome not stored outside a runtime: the key stays in flight until its lease ends"
        );
        return;
    };
    runtime.spawn(async move {
        let lease = c.config.lease;
        let give_up = Instant::now().checked_add(c.config.ttl);
        let mut wait = Duration::from_millis(100);
        loop {
            match c
                .store
                .complete(&c.key, c.claim, c.fingerprint, record.clone(), c.config.ttl)
                .await
            {
                Ok(()) => {
                    tracing::info!(key = cap(&c.shown, 64), "idempotency outcome stored after a retry");
                    return;
                }
                Err(err) if err.is_fenced() => {
                    tracing::warn!(key = cap(&c.shown, 64), "idempotency claim taken over before its outcome was stored (the store was out longer than the lease)");
                    return;
                }
                Err(err) => {
                    tracing::warn!(error = %err, cause = super::cause(&err), key = cap(&c.shown, 64), "idempotency outcome not stored yet; the key is held in flight");
                    if let Err(err) = c.store.renew(&c.key, c.claim, lease).await {
                        if err.is_fenced() {
                            return;
                        }
                    }
                }
            }
            if give_up.is_some_and(|end| Instant::now() >= end) {
                tracing::warn!(key = cap(&c.shown, 64), "idempotency outcome never stored within the key's TTL; the key is freed when its lease ends");
                return;
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(lease / 3);
        }
    });
}
