//! The keyed call: once a handler has been called for a key, its outcome is kept, whatever
//! happens to the request that started it.
//!
//! hyper drops a request's future when its client goes away (a client timeout, a disconnect).
//! If that dropped the handler too, a handler that had applied its effect and was still busy
//! would leave nothing behind, and the client's retry with the same key would run it again.
//! So the call runs in a task of its own that the connection does not own: it drives the
//! handler to completion, renews the claim's lease meanwhile, and stores the outcome; the
//! request merely waits for it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{Either, Full};
use tokio::task::JoinHandle;
use tower_service::Service;

use super::layer::Config;
use super::outcome;
use super::service::{buffer, Buffered};
use super::store::{Claim, IdempotencyStore, StoreError, StoredResponse};
use super::ResponseBody;
use crate::attempts::cap;
use crate::BoxError;

/// A key this request claimed, whose handler is about to run.
pub(crate) struct Claimed<St> {
    pub(crate) store: Arc<St>,
    pub(crate) config: Arc<Config>,
    /// The key as stored (scoped, if keys are scoped).
    pub(crate) key: Arc<str>,
    pub(crate) claim: Claim,
}

/// Calls the handler for a claimed key and keeps its outcome. The call runs in the request's
/// future; if that future is dropped before the call ends (the client went away), the rest of
/// the call is spawned on the current tokio runtime and runs to completion there. Detaching
/// only on drop keeps a task spawn off the common path. Outside a runtime a dropped call
/// ends where it was (its key stays in flight until its lease ends: never freed).
pub(crate) fn call<S, St, B, ResBody>(
    inner: S,
    claimed: Claimed<St>,
    req: Request<Either<Full<Bytes>, B>>,
) -> DetachOnDrop<impl Future<Output = Result<Response<ResponseBody<ResBody>>, S::Error>> + Send>
where
    S: Service<Request<Either<Full<Bytes>, B>>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: IdempotencyStore,
    B: Send + 'static,
    ResBody: Body<Data = Bytes> + Unpin + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    DetachOnDrop {
        rest: Some(Box::pin(run(inner, claimed, req))),
        polling: false,
    }
}

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

async fn run<S, St, B, ResBody>(
    mut inner: S,
    claimed: Claimed<St>,
    req: Request<Either<Full<Bytes>, B>>,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<Either<Full<Bytes>, B>>, Response = Response<ResBody>>,
    St: IdempotencyStore,
    ResBody: Body<Data = Bytes> + Unpin,
    ResBody::Error: Into<BoxError>,
{
    let config = claimed.config.clone();
    let work = async {
        let res = inner.call(req).await?;
        let (parts, body) = res.into_parts();
        Ok((parts, buffer(body, config.max_response_bytes).await))
    };
    // The guard is armed before the handler is called: a panic in it keeps the key too.
    let mut pending = Pending {
        claimed: Some(claimed),
    };
    let ended = pending.renewing(work).await;
    let (parts, buffered) = match ended {
        Ok(done) => done,
        Err(err) => {
            // Called, then no response: it may have applied. Keep a record that says so
            // rather than free the key for a second run.
            pending.keep(outcome::unknown(), "the handler failed").await;
            return Err(err);
        }
    };
    let declined = parts.status.is_server_error() && !config.store_server_errors;
    match buffered {
        Buffered::Whole(bytes) => {
            if declined {
                pending.release().await;
            } else {
                let record =
                    StoredResponse::new(parts.status, parts.headers.clone(), bytes.clone());
                if let Err(record) = pending.try_keep(record).await {
                    // The whole response did not fit the store; its head is better than none.
                    let head = outcome::head_only(record.status(), record.headers());
                    pending
                        .keep(head, "the response did not fit the store")
                        .await;
                }
            }
            Ok(Response::from_parts(parts, ResponseBody::full(bytes)))
        }
        Buffered::Partial {
            prefix,
            trailers,
            rest,
            why,
        } => {
            if declined {
                pending.release().await;
            } else {
                let head = outcome::head_only(parts.status, &parts.headers);
                pending.keep(head, why).await;
            }
            Ok(Response::from_parts(
                parts,
                ResponseBody::stream(prefix, trailers, rest),
            ))
        }
    }
}

/// Renews the claim's lease every third of it while the handler runs, in a task of its own
/// so that a slow store never holds the handler up. Stops when dropped.
struct Renewal(Option<JoinHandle<()>>);

impl Renewal {
    /// Runs `work` under a renewed lease. Most handlers end well within a third of the lease,
    /// so the renewal task is started only for one that is still running then.
    async fn during<St: IdempotencyStore, F: Future>(c: &Claimed<St>, work: F) -> F::Output {
        if tokio::runtime::Handle::try_current().is_err() {
            return work.await;
        }
        let mut work = std::pin::pin!(work);
        match tokio::time::timeout(c.config.lease / 3, work.as_mut()).await {
            Ok(out) => out,
            Err(_) => {
                let _renewal = Renewal::start(c);
                work.await
            }
        }
    }

    /// Renews now, then every third of the lease.
    fn start<St: IdempotencyStore>(c: &Claimed<St>) -> Self {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Renewal(None);
        };
        let (store, key, claim, lease) = (c.store.clone(), c.key.clone(), c.claim, c.config.lease);
        Renewal(Some(runtime.spawn(async move {
            loop {
                if let Err(err) = store.renew(&key, claim, lease).await {
                    // Fenced: the lease ended (a store outage longer than it) and the key may
                    // have been claimed again; nothing to renew any more.
                    let fenced = err.is_fenced();
                    tracing::warn!(error = %err, fenced, key = cap(&key, 64), "idempotency claim not renewed");
                    if fenced {
                        return;
                    }
                }
                tokio::time::sleep(lease / 3).await;
            }
        })))
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// The claim until its outcome is stored. Dropped while still holding it — the handler
/// panicked, or the runtime is shutting down — it stores the "unknown" record from a task of
/// its own; the key is never freed.
struct Pending<St: IdempotencyStore> {
    claimed: Option<Claimed<St>>,
}

/// Waits between tries of a `complete` that failed in the store's backend: a store that
/// blinks must not cost the record (the lease would end, and the key be free).
const COMPLETE_RETRIES: [Duration; 3] = [
    Duration::from_millis(50),
    Duration::from_millis(250),
    Duration::from_secs(1),
];

impl<St: IdempotencyStore> Pending<St> {
    /// Runs the handler's `work` under the claim's renewed lease.
    async fn renewing<F: Future>(&self, work: F) -> F::Output {
        match &self.claimed {
            Some(c) => Renewal::during(c, work).await,
            None => work.await,
        }
    }

    /// Stores `record`, or hands it back if the store refused it (the claim stays held).
    async fn try_keep(&mut self, record: StoredResponse) -> Result<(), StoredResponse> {
        let Some(c) = &self.claimed else {
            return Ok(());
        };
        // Waiting needs a runtime's timer; outside one, one try.
        let waits: &[Duration] = match tokio::runtime::Handle::try_current() {
            Ok(_) => &COMPLETE_RETRIES,
            Err(_) => &[],
        };
        let mut waits = waits.iter();
        let err = loop {
            match complete(c, record.clone()).await {
                Ok(()) => {
                    self.claimed = None;
                    return Ok(());
                }
                Err(err) if err.is_full() || err.is_fenced() => break err,
                Err(err) => match waits.next() {
                    Some(wait) => tokio::time::sleep(*wait).await,
                    None => break err,
                },
            }
        };
        if err.is_fenced() {
            // Another claim holds the key now: its outcome stands, ours is not written over it.
            tracing::warn!(key = cap(&c.key, 64), "idempotency claim was taken over before its outcome was stored; the newer claim's outcome stands");
            self.claimed = None;
            return Ok(());
        }
        tracing::warn!(error = %err, key = cap(&c.key, 64), "idempotency store refused a response");
        Err(record)
    }

    /// Stores a stand-in `record` for an outcome that could not be kept whole; if the store
    /// refuses it, the key stays in flight until its lease ends.
    async fn keep(&mut self, record: StoredResponse, why: &'static str) {
        let Some(key) = self.claimed.as_ref().map(|c| c.key.clone()) else {
            return;
        };
        let key = cap(&key, 64);
        if self.try_keep(record).await.is_ok() {
            tracing::warn!(
                key,
                why,
                "idempotency key stored with a stand-in for its response"
            );
        } else {
            // Tried; the store keeps the key in flight, which is never a second run.
            self.claimed = None;
            tracing::warn!(
                key,
                why,
                "idempotency key kept in flight until its lease ends: its handler ran, and no record of the outcome could be stored"
            );
        }
    }

    /// Frees the key: the handler answered a server error and the layer was told not to keep
    /// those (`store_server_errors(false)`: the handler promises a 5xx applied nothing).
    async fn release(&mut self) {
        if let Some(c) = self.claimed.take() {
            if let Err(err) = c.store.release(&c.key, c.claim).await {
                tracing::warn!(error = %err, key = cap(&c.key, 64), "could not free an idempotency key after a server error; it is freed when its lease ends");
            }
        }
    }
}

fn complete<St: IdempotencyStore>(
    c: &Claimed<St>,
    record: StoredResponse,
) -> impl std::future::Future<Output = Result<(), StoreError>> + '_ {
    c.store.complete(&c.key, c.claim, record, c.config.ttl)
}

impl<St: IdempotencyStore> Drop for Pending<St> {
    fn drop(&mut self) {
        let Some(c) = self.claimed.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Err(err) = complete(&c, outcome::unknown()).await {
                        tracing::warn!(error = %err, key = cap(&c.key, 64), "idempotency key kept in flight until its lease ends: its handler ended without a response");
                    }
                });
            }
            Err(_) => tracing::warn!(
                key = cap(&c.key, 64),
                "idempotency key kept in flight until its lease ends: its handler ended outside a runtime"
            ),
        }
    }
}
