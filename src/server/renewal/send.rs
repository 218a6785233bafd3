//! Sending one renewal to the store, from the ticker or from a handler's task.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use super::{DueClaim, Renewals};
use crate::server::observe::{Observe, RenewalResult};
use crate::server::store::{Claim, IdempotencyStore};
use crate::target::cap;

/// Sends one renewal. It is polled here once, so that a store that answers at once (the memory
/// store) renews within this turn of the ticker; a store that must wait for a reply is awaited
/// from a task of its own, bounded by the renewal interval, so that the next renewal never
/// waits for it.
pub(super) async fn renew<St: IdempotencyStore>(
    renewals: &Renewals<St>,
    (key, shown, claim): DueClaim,
) {
    let mut call = Some((key, shown));
    std::future::poll_fn(|cx| {
        if let Some((key, shown)) = call.take() {
            let (store, lease, observe) = (&renewals.store, renewals.lease, &renewals.observe);
            send_renewal(store, lease, observe, key, shown, claim, cx);
        }
        Poll::Ready(())
    })
    .await;
}

/// Sends one renewal, polled once with `cx`; if it must wait for a reply, it goes on in a task
/// of its own.
pub(super) fn send_renewal<St: IdempotencyStore>(
    store: &Arc<St>,
    lease: Duration,
    observe: &Observe,
    key: Arc<str>,
    shown: Arc<str>,
    claim: Claim,
    cx: &mut Context<'_>,
) {
    let store = store.clone();
    let observe = observe.clone();
    let mut call = Box::pin(async move {
        let renewed = tokio::time::timeout(lease / 4, store.renew(&key, claim, lease)).await;
        match renewed {
            Ok(Ok(())) => observe.renewal(RenewalResult::Renewed),
            Ok(Err(err)) => {
                observe.renewal(if err.is_fenced() {
                    RenewalResult::Fenced
                } else {
                    RenewalResult::Failed
                });
                // Fenced: the lease ended (a store outage longer than it) and the key may have
                // been claimed again; the next tick tries again and is refused again, and the
                // claim's outcome is fenced when it is stored.
                tracing::warn!(error = %err, cause = crate::server::cause(&err), fenced = err.is_fenced(), key = cap(&shown, 64), "idempotency claim not renewed");
            }
            Err(_) => {
                observe.renewal(RenewalResult::Failed);
                tracing::warn!(key = cap(&shown, 64), "idempotency claim renewal timed out");
            }
        }
    });
    if call.as_mut().poll(cx).is_pending() {
        drop(tokio::spawn(
            call as Pin<Box<dyn Future<Output = ()> + Send>>,
        ));
    }
}
