//! The keyed call: once a handler has been called for a key, its outcome is kept, whatever
//! happens to the request that started it.
//!
//! hyper drops a request's future when its client goes away (a client timeout, a disconnect).
//! If that dropped the handler too, a handler that had applied its effect and was still busy
//! would leave nothing behind, and the client's retry with the same key would run it again.
//! So the call is detached onto the runtime when its request goes away: it drives the handler
//! to completion, renews the claim's lease meanwhile, and stores the outcome.

use std::future::{poll_fn, Future};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tokio::time::Instant;
use tower_service::Service;

use crate::answers;
use crate::body::ResponseBody;
use crate::buffer::{buffer, Buffered};
use crate::claim::Claimed;
use crate::deadline::NothingRan;
use crate::detach::DetachOnDrop;
use crate::mode::{whole, InnerBody};
use crate::renewal::Renewal;
use crate::store::{IdempotencyStore, StoreError, StoredResponse};
use crate::text::cap;
use tower_retry_safety::deadline::{self, Inbound};
use tower_retry_safety::BoxError;

/// Calls the handler for a claimed key and keeps its outcome. The call runs in the request's
/// future; if that future is dropped before the call ends (the client went away), the rest of
/// the call is spawned on the current tokio runtime and runs to completion there. Detaching
/// only on drop keeps a task spawn off the common path. Outside a runtime a dropped call
/// ends where it was (its key stays in flight until its lease ends: never freed).
pub(crate) fn call<S, St, B, ResBody>(
    inner: S,
    claimed: Claimed<St>,
    renewal: Renewal<St>,
    req: Request<InnerBody<B>>,
) -> DetachOnDrop<impl Future<Output = Result<Response<ResponseBody<ResBody>>, S::Error>> + Send>
where
    S: Service<Request<InnerBody<B>>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: IdempotencyStore,
    B: Send + 'static,
    ResBody: Body<Data = Bytes> + Unpin + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    // The caller's deadline goes with the call, also into the task that finishes it when
    // the request goes away: the handler's nested calls still see it.
    let inbound = req.extensions().get::<Inbound>().copied();
    let run = run(inner, claimed, renewal, req);
    DetachOnDrop::new(async move {
        match inbound {
            Some(inbound) => deadline::scope(inbound, run).await,
            None => run.await,
        }
    })
}

/// The keyed call itself: an `async` block rather than an `async fn` (whose arguments would
/// take room twice), so that this future — boxed once per keyed request — stays small. The
/// claim's lease is renewed meanwhile by `renewal`, on its own schedule.
// Not an `async fn`: its arguments would take room twice in the future.
#[allow(clippy::manual_async_fn)]
fn run<S, St, B, ResBody>(
    mut inner: S,
    claimed: Claimed<St>,
    mut renewal: Renewal<St>,
    req: Request<InnerBody<B>>,
) -> impl Future<Output = Result<Response<ResponseBody<ResBody>>, S::Error>> + Send
where
    S: Service<Request<InnerBody<B>>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: IdempotencyStore,
    B: Send + 'static,
    ResBody: Body<Data = Bytes> + Unpin + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    async move {
        let limit = claimed.config.max_response_bytes;
        let store_server_errors = claimed.config.store_server_errors;
        if renewal.spawned_task() {
            // Let the ticker this claim just spawned have its first poll (see
            // `Renewal::spawned_task`): woken at once, this task goes to the back of the
            // queue, behind it.
            let mut yielded = false;
            poll_fn(|cx| {
                if std::mem::replace(&mut yielded, true) {
                    Poll::Ready(())
                } else {
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
            })
            .await;
        }
        // The guard is armed before the handler is called: a panic in it keeps the key too.
        let mut pending = Pending {
            claimed: Some(claimed),
        };
        // Nobody waits for the answer any more: the handler is not called, and its key is
        // freed (it provably did not run).
        if req
            .extensions()
            .get::<Inbound>()
            .is_some_and(Inbound::has_passed)
        {
            renewal.stop();
            pending.release().await;
            return Ok(answers::caller_gone());
        }
        let called = renewal
            .during(async {
                let res = inner.call(req).await?;
                // A deadline layer inside this one answered for the handler, which it did
                // not call: that answer is not the key's.
                if res.extensions().get::<NothingRan>().is_some() {
                    return Ok(Err(res));
                }
                let (parts, body) = res.into_parts();
                Ok(Ok((parts, buffer(body, limit).await)))
            })
            .await;
        // The lease is no longer renewed once the outcome is being stored.
        renewal.stop();
        let (parts, buffered) = match called {
            Ok(Ok(answered)) => answered,
            Ok(Err(nothing_ran)) => {
                // Freed, not stored: a retry in time runs the handler.
                pending.release().await;
                return Ok(
                    nothing_ran.map(|body| ResponseBody::stream(Bytes::new(), None, None, body))
                );
            }
            Err(err) => {
                // Called, then no response: it may have applied. Keep an entry that says so
                // rather than free the key for a second run.
                pending
                    .keep(answers::unknown, Some("the handler failed"))
                    .await;
                return Err(err);
            }
        };
        let declined =
            answers::is_server_error(parts.status, &parts.headers) && !store_server_errors;
        Ok(finish(pending, parts, buffered, declined).await)
    }
}

/// Stores the outcome of a call that answered (or frees its key, `declined`: a 5xx the layer
/// was told not to keep), and makes its response.
// Not an `async fn`: its arguments would take room twice in the future.
#[allow(clippy::manual_async_fn)]
fn finish<St: IdempotencyStore, ResBody>(
    mut pending: Pending<St>,
    parts: http::response::Parts,
    buffered: Buffered<ResBody>,
    declined: bool,
) -> impl Future<Output = Response<ResponseBody<ResBody>>> + Send
where
    ResBody: Send,
{
    async move {
        match buffered {
            Buffered::Whole(bytes, trailers) => {
                if declined {
                    pending.release().await;
                } else {
                    let stored = || whole(&parts, &bytes, trailers.as_ref());
                    pending.keep(stored, None).await;
                }
                Response::from_parts(parts, ResponseBody::full_with_trailers(bytes, trailers))
            }
            Buffered::Partial {
                prefix,
                trailers,
                error,
                rest,
                why,
            } => {
                if declined {
                    pending.release().await;
                } else {
                    let head = || answers::head_only(parts.status, &parts.headers);
                    pending.keep(head, Some(why)).await;
                }
                let body = ResponseBody::stream(prefix, trailers, error, rest);
                Response::from_parts(parts, body)
            }
        }
    }
}

/// The claim until its stored response is written. Dropped while still holding it — the handler
/// panicked, or the runtime is shutting down — it settles the "unknown" entry from a task of
/// its own; the key is never freed.
struct Pending<St: IdempotencyStore> {
    claimed: Option<Claimed<St>>,
}

impl<St: IdempotencyStore> Pending<St> {
    /// Stores the response `stored` makes (`why` says why it stands in for the response, if it
    /// does). A store that is full gets the response's head instead; one that fails, or is
    /// full even for that, is tried again in the background while the key is held: never
    /// freed. The entry is made again only on a refusal, so a stored one costs one copy.
    async fn keep(&mut self, stored: impl Fn() -> StoredResponse, why: Option<&'static str>) {
        let Some(c) = self.claimed.take() else {
            return;
        };
        let shown = cap(&c.shown, 64);
        let err = match complete(&c, stored()).await {
            Ok(()) => {
                if let Some(why) = why {
                    tracing::warn!(
                        key = shown,
                        why,
                        "idempotency key stored with a stand-in for its response"
                    );
                }
                return;
            }
            Err(err) => err,
        };
        if err.is_fenced() {
            // Another claim holds the key now: its stored response stands, ours is not written
            // over it.
            tracing::warn!(key = shown, "idempotency claim was taken over before its outcome was stored; the newer claim's outcome stands");
            return;
        }
        tracing::warn!(error = %err, cause = crate::store::cause(&err), key = shown, "idempotency store refused an outcome; the key is held in flight and it is tried again");
        let stored = stored();
        let stored = if err.is_full() && why.is_none() {
            // The whole response did not fit; its head is better than nothing.
            let head = || answers::head_only(stored.status(), stored.headers());
            match complete(&c, head()).await {
                Ok(()) => return,
                Err(err) if err.is_fenced() => return,
                Err(_) => head(),
            }
        } else {
            stored
        };
        settle(c, stored);
    }

    /// Frees the key: the handler did not run (its caller's deadline had passed), or it
    /// answered a server error and the layer was told not to keep those
    /// (`store_server_errors(false)`: the handler promises a 5xx applied nothing).
    async fn release(&mut self) {
        if let Some(c) = self.claimed.take() {
            if let Err(err) = c.store.release(&c.key, c.token).await {
                tracing::warn!(error = %err, cause = crate::store::cause(&err), key = cap(&c.shown, 64), "could not free an idempotency key whose handler did not run or declined; it is freed when its lease ends");
            }
        }
    }
}

fn complete<St: IdempotencyStore>(
    c: &Claimed<St>,
    stored: StoredResponse,
) -> impl Future<Output = Result<(), StoreError>> + '_ {
    c.store
        .complete(&c.key, c.token, c.fingerprint, stored, c.config.ttl)
}

impl<St: IdempotencyStore> Drop for Pending<St> {
    fn drop(&mut self) {
        if let Some(c) = self.claimed.take() {
            settle(c, answers::unknown());
        }
    }
}

/// Holds the key in flight (renewing its lease) and, from a task of its own, tries to store
/// `stored` again until it is written, the claim is taken over (a store outage longer than the
/// lease), or the key's TTL has passed.
pub(crate) fn settle<St: IdempotencyStore>(c: Claimed<St>, stored: StoredResponse) {
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
                .complete(&c.key, c.token, c.fingerprint, stored.clone(), c.config.ttl)
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
                    tracing::warn!(error = %err, cause = crate::store::cause(&err), key = cap(&c.shown, 64), "idempotency outcome not stored yet; the key is held in flight");
                    // A refused renewal does not end the loop: a store that wrote the entry
                    // but could not confirm it (`RedisStore` waiting for replicas) holds the
                    // completed entry, which is no claim to renew. The next `complete` says
                    // whether another claim took the key.
                    let _ = c.store.renew(&c.key, c.token, lease).await;
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

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use bytes::Bytes;
    use http::{Request, Response, StatusCode};
    use http_body_util::{BodyExt, Full};
    use tower::{service_fn, Layer, ServiceExt};

    use crate::layer::IdempotencyLayer;
    use crate::memory::MemoryStore;

    /// The lease is renewed while a slow handler runs (the keeper polls the first-renewal
    /// timer only once the handler is pending): a repeat long past the lease gets 409, and
    /// the handler runs once.
    #[tokio::test(start_paused = true)]
    async fn a_handler_outlasting_its_lease_keeps_the_key() {
        static RUNS: AtomicUsize = AtomicUsize::new(0);
        let layer = IdempotencyLayer::new(MemoryStore::new()).lease(Duration::from_millis(30));
        let svc = layer.layer(service_fn(|_req: Request<_>| async {
            RUNS.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
        }));
        let send = || {
            Request::post("/v1/send")
                .header("idempotency-key", "\"slow\"")
                .body(Full::new(Bytes::from_static(b"x")))
                .unwrap()
        };
        let first = tokio::spawn(svc.clone().oneshot(send()));
        tokio::time::sleep(Duration::from_millis(120)).await;
        let during = svc.clone().oneshot(send()).await.unwrap();
        assert_eq!(during.status(), StatusCode::CONFLICT, "the lease lapsed");
        let first = first.await.unwrap().unwrap();
        assert_eq!(
            first.into_body().collect().await.unwrap().to_bytes(),
            "done"
        );
        let after = svc.oneshot(send()).await.unwrap();
        assert_eq!(after.headers()["idempotent-replayed"], "true");
        assert_eq!(RUNS.load(Ordering::SeqCst), 1);
    }
}
