//! The keyed call: once a handler has been called for a key, its outcome is kept, whatever
//! happens to the request that started it.
//!
//! hyper drops a request's future when its client goes away (a client timeout, a disconnect).
//! If that dropped the handler too, a handler that had applied its effect and was still busy
//! would leave nothing behind, and the client's retry with the same key would run it again.
//! So the call runs in a task of its own that the connection does not own: it drives the
//! handler to completion and stores the outcome, and the request merely waits for it.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{Either, Full};
use tower_service::Service;

use super::layer::Config;
use super::outcome;
use super::service::{buffer, stored_response, Buffered};
use super::store::{Fingerprint, IdempotencyStore, StoredResponse};
use super::ResponseBody;
use crate::attempts::cap;
use crate::BoxError;

/// A key this request claimed, whose handler is about to run.
pub(crate) struct Claimed<St> {
    pub(crate) store: Arc<St>,
    pub(crate) config: Arc<Config>,
    pub(crate) key: Arc<str>,
    pub(crate) fingerprint: Fingerprint,
}

/// Calls the handler for a claimed key and keeps its outcome. Spawned on the current tokio
/// runtime so that it outlives the request; outside a runtime it runs in the request's own
/// future (and a drop there leaves the key in flight until its TTL: never freed).
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
    let limit = claimed.config.max_response_bytes;
    let mut pending = Pending {
        claimed: Some(claimed),
    };
    let res = match inner.call(req).await {
        Ok(res) => res,
        Err(err) => {
            // Called, then no response: it may have applied. Keep a record that says so
            // rather than free the key for a second run.
            pending.keep(outcome::unknown(), "the handler failed").await;
            return Err(err);
        }
    };
    let (parts, body) = res.into_parts();
    match buffer(body, limit).await {
        Buffered::Whole(bytes) => {
            let record = StoredResponse::new(parts.status, parts.headers.clone(), bytes.clone());
            if let Err(record) = pending.try_keep(record).await {
                // The whole response did not fit the store; its head is better than nothing.
                let head = outcome::head_only(record.status(), record.headers());
                pending
                    .keep(head, "the response did not fit the store")
                    .await;
            }
            Ok(Response::from_parts(parts, ResponseBody::full(bytes)))
        }
        Buffered::Partial {
            prefix,
            trailers,
            rest,
            why,
        } => {
            let head = outcome::head_only(parts.status, &parts.headers);
            pending.keep(head, why).await;
            Ok(Response::from_parts(
                parts,
                ResponseBody::stream(prefix, trailers, rest),
            ))
        }
    }
}

/// The claim until its outcome is stored. Dropped while still holding it — the handler
/// panicked, or the runtime is shutting down — it stores the "unknown" record from a task of
/// its own; the key is never freed.
struct Pending<St: IdempotencyStore> {
    claimed: Option<Claimed<St>>,
}

impl<St: IdempotencyStore> Pending<St> {
    /// Stores `record`, or hands it back if the store refused it (the claim stays held).
    async fn try_keep(&mut self, record: StoredResponse) -> Result<(), StoredResponse> {
        let Some(c) = &self.claimed else {
            return Ok(());
        };
        match c
            .store
            .complete(&c.key, c.fingerprint, record.clone(), c.config.ttl)
            .await
        {
            Ok(()) => {
                self.claimed = None;
                Ok(())
            }
            Err(err) => {
                tracing::warn!(error = %err, key = cap(&c.key, 64), "idempotency store refused a response");
                Err(record)
            }
        }
    }

    /// Stores a stand-in `record` for an outcome that could not be kept whole; if the store
    /// refuses it, the key stays in flight until its TTL.
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
                "idempotency key kept in flight until its TTL: its handler ran, and no record of the outcome could be stored"
            );
        }
    }
}

impl<St: IdempotencyStore> Drop for Pending<St> {
    fn drop(&mut self) {
        let Some(c) = self.claimed.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let record = outcome::unknown();
                    if let Err(err) = c.store.complete(&c.key, c.fingerprint, record, c.config.ttl).await {
                        tracing::warn!(error = %err, key = cap(&c.key, 64), "idempotency key kept in flight until its TTL: its handler ended without a response");
                    }
                });
            }
            Err(_) => tracing::warn!(
                key = cap(&c.key, 64),
                "idempotency key kept in flight until its TTL: its handler ended outside a runtime"
            ),
        }
    }
}
