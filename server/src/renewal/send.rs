//! Sending one renewal to the store, from the ticker or from a handler's task.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use super::{DueClaim, Renewals, EVERY, RETRY, TICKS};
use crate::observe::{Observe, RenewalResult};
use crate::store::{FencingToken, IdempotencyStore};
use crate::text::cap;

/// Sends one renewal. It is polled here once, so that a store that answers at once (the memory
/// store) renews within this turn of the ticker; a store that must wait for a reply is awaited
/// from a task of its own, so that the next renewal never waits for it.
pub(super) async fn renew<St: IdempotencyStore>(
    renewals: &Renewals<St>,
    (key, shown, token): DueClaim,
) {
    let mut call = Some((key, shown));
    std::future::poll_fn(|cx| {
        if let Some((key, shown)) = call.take() {
            let (store, lease, observe) = (&renewals.store, renewals.lease, &renewals.observe);
            send_renewal(store, lease, observe, key, shown, token, cx);
        }
        Poll::Ready(())
    })
    .await;
}

/// Sends one renewal, polled once with `cx`; if it must wait for a reply, it goes on in a task
/// of its own. A renewal that fails (not fenced) is sent again every [`RETRY`]th of the lease
/// until it lands, for a quarter lease and a tick (until the next scheduled renewal has
/// started): an outage that ends before the lease that the last renewal set then costs no
/// claim. Waiting a quarter lease after a failed attempt would let an outage of three quarters
/// of it do so.
pub(super) fn send_renewal<St: IdempotencyStore>(
    store: &Arc<St>,
    lease: Duration,
    observe: &Observe,
    key: Arc<str>,
    shown: Arc<str>,
    token: FencingToken,
    cx: &mut Context<'_>,
) {
    let store = store.clone();
    let observe = observe.clone();
    let mut call = Box::pin(async move {
        let end = Instant::now() + lease / EVERY + lease / TICKS;
        let pause = (lease / RETRY).max(Duration::from_millis(1));
        let failed = loop {
            let left = end.saturating_duration_since(Instant::now());
            let failed = match tokio::time::timeout(left, store.renew(&key, token, lease)).await {
                Ok(Ok(())) => return observe.renewal(RenewalResult::Renewed),
                Ok(Err(err)) if err.is_fenced() => {
                    observe.renewal(RenewalResult::Fenced);
                    // The lease ended (a store outage longer than it) and the key may have been
                    // claimed again; the claim's outcome is fenced when it is stored.
                    tracing::warn!(error = %err, fenced = true, key = cap(&shown, 64), "idempotency claim not renewed");
                    return;
                }
                Ok(Err(err)) => Some(err),
                Err(_) => None,
            };
            if Instant::now() + pause >= end {
                break failed;
            }
            tokio::time::sleep(pause).await;
        };
        observe.renewal(RenewalResult::Failed);
        match failed {
            Some(err) => {
                tracing::warn!(error = %err, cause = crate::store::cause(&err), key = cap(&shown, 64), "idempotency claim not renewed")
            }
            None => tracing::warn!(key = cap(&shown, 64), "idempotency claim renewal timed out"),
        }
    });
    if call.as_mut().poll(cx).is_pending() {
        drop(tokio::spawn(
            call as Pin<Box<dyn Future<Output = ()> + Send>>,
        ));
    }
}
