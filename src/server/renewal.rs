//! Keeping a claim alive: renewing its lease while the handler runs, and holding the key while
//! an outcome that the store refused is tried again. A claim whose lease lapses after its
//! handler ran would free the key, so neither may be left to chance.

use std::future::{poll_fn, Future};
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

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

/// Runs `work`; if it is still running when `first` fires (a third of the lease), renews the
/// lease from a task of its own until `work` ends. Most handlers end well before, and never
/// pay for the task.
pub(crate) async fn during<St: IdempotencyStore, F: Future>(
    c: &Claimed<St>,
    first: Option<Sleep>,
    work: F,
) -> F::Output {
    let Some(first) = first else {
        return work.await;
    };
    let mut first = pin!(first);
    let mut work = pin!(work);
    let early = poll_fn(|cx| {
        if let Poll::Ready(out) = work.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        first.as_mut().poll(cx).map(|()| None)
    })
    .await;
    if let Some(out) = early {
        return out;
    }
    let _renewing = Renewing::start(c);
    work.await
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
                .complete(&c.key, c.claim, record.clone(), c.config.ttl)
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
