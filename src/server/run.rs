//! The keyed call: once a handler has been called for a key, its outcome is kept, whatever
//! happens to the request that started it.
//!
//! hyper drops a request's future when its client goes away (a client timeout, a disconnect).
//! If that dropped the handler too, a handler that had applied its effect and was still busy
//! would leave nothing behind, and the client's retry with the same key would run it again.
//! So the call runs in a task of its own that the connection does not own: it drives the
//! handler to completion, renews the claim's lease meanwhile, and stores the outcome; the
//! request merely waits for it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{Either, Full};
use tokio::task::JoinHandle;
use tower_service::Service;

use super::layer::Config;
use super::outcome;
use super::service::{buffer, stored_response, Buffered};
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

/// Calls the handler for a claimed key and keeps its outcome. Spawned on the current tokio
/// runtime so that it outlives the request; outside a runtime it runs in the request's own
/// future, without lease renewal (and a drop there leaves the key in flight until its lease
/// ends).
pub(crate) async fn call<S, St, B, ResBody>(
    inner: S,
    claimed: Claimed<St>,
    req: Request<Either<Full<Bytes>, B>>,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<Either<Full<Bytes>, B>>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: IdempotencyStore,
    B: Send + 'static,
    ResBody: Body<Data = Bytes> + Unpin + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return run(inner, claimed, req).await;
    };
    match runtime.spawn(run(inner, claimed, req)).await {
        Ok(outcome) => outcome,
        // The handler panicked: its task's guard stored an "unknown" record; hyper handles
        // the panic as it would have without the layer.
        Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
        // The runtime is shutting down: the guard keeps the key.
        Err(_) => Ok(stored_response(&outcome::unknown())),
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
    let renewal = Renewal::start(&claimed);
    let mut pending = Pending {
        claimed: Some(claimed),
    };
    let res = match inner.call(req).await {
        Ok(res) => res,
        Err(err) => {
            drop(renewal);
            // Called, then no response: it may have applied. Keep a record that says so
            // rather than free the key for a second run.
            pending.keep(outcome::unknown(), "the handler failed").await;
            return Err(err);
        }
    };
    let (parts, body) = res.into_parts();
    let buffered = buffer(body, config.max_response_bytes).await;
    drop(renewal);
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
    fn start<St: IdempotencyStore>(c: &Claimed<St>) -> Self {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Renewal(None);
        };
        let (store, key, claim, lease) = (c.store.clone(), c.key.clone(), c.claim, c.config.lease);
        Renewal(Some(runtime.spawn(async move {
            loop {
                tokio::time::sleep(lease / 3).await;
                if let Err(err) = store.renew(&key, claim, lease).await {
                    // Fenced: the lease ended (a store outage longer than it) and the key may
                    // have been claimed again; nothing to renew any more.
                    let fenced = err.is_fenced();
                    tracing::warn!(error = %err, fenced, key = cap(&key, 64), "idempotency claim not renewed");
                    if fenced {
                        return;
                    }
                }
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
