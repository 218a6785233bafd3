//! Atomic mode: the key's row commits in the handler's own transaction.
//!
//! `claim` begins the request's transaction with the key's lock and in-flight row, `run` calls
//! the handler in it and commits the response with the key, `transaction` is what the handler
//! gets.

mod claim;
mod run;
mod transaction;

use std::future::{ready, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::Either;
use tower_layer::Layer;
use tower_service::Service;

use crate::body::ResponseBody;
use crate::mode::{key_of, Config, InnerBody};
use crate::postgres::PostgresStore;
use tower_retry_safety::BoxError;

pub use transaction::{KeyTransaction, KeyTransactionGuard, TransactionError};

/// Idempotency keys that commit in the handler's own transaction (atomic mode of
/// [`PostgresStore`]), made by
/// [`IdempotencyLayer::atomic`](crate::layer::IdempotencyLayer::atomic).
///
/// For a request with a key, the layer:
///
/// 1. takes the key's **advisory transaction lock** with `pg_try_advisory_xact_lock`, which
///    never waits: a repeat while the first runs (on this server or another) gets **409** at
///    once;
/// 2. checks, under the lock, that no live entry holds the key, and begins the transaction
///    (steps 1 and 2 are one round trip); a completed entry is answered with its stored response (422 if the request
///    differs), and nothing runs;
/// 3. hands the transaction to the handler as a [`KeyTransaction`] in the request's
///    extensions; the handler does its writes there;
/// 4. writes the response into the key's row **in the same transaction** and commits once.
///
/// So the key and the handler's writes commit together or not at all:
///
/// - the handler returns an error or panics, or its process dies (a crash, `SIGKILL`, a lost
///   connection): the transaction rolls back; nothing was committed, the key is free, and a
///   repeat runs on a clean slate;
/// - the commit is acknowledged: a repeat gets the stored response;
/// - the database fails at any point (the key cannot be read, the entry cannot be written,
///   the commit is not acknowledged): **503** with `Retry-After`. Repeating the same key is
///   safe whatever happened: a commit that went through answers with its stored response, one that did not runs
///   again.
///
/// The advisory lock rather than `SELECT … FOR UPDATE NOWAIT`: a row lock needs a row, and a
/// new key has none that others can see until the first request commits (a concurrent
/// `INSERT` of the same key waits for that commit instead of failing). The advisory lock
/// exists before any row, never waits with the `try` form, and ends with the transaction —
/// commit, rollback, or the death of the session's connection — so no lease guesses at a
/// dead server. Its id is 64 bits of a SHA-256 of the key: a collision (odds of 2⁻⁶⁴ per pair
/// of keys in flight) only answers 409. Advisory locks belong to the database, not to a
/// schema: two services whose tables sit in different schemas of one database, handling the
/// same key at the same moment, answer each other 409 too.
///
/// # What it does not cover
///
/// Effects outside the transaction — an email sent, a card charged — are not rolled back. A
/// handler re-run after a crash repeats them unless the provider honours keys and the handler
/// sends the key [derived](crate::derive::RequestKey::derive) from the request's: then the
/// provider answers with its stored response. A handler whose process died keeps nothing, so this is the window the
/// derived keys close.
///
/// # A handler must leave the transaction to the layer
///
/// A handler gets the connection, not the transaction: it cannot commit or drop it through
/// the API. If it ends it by hand (`COMMIT` or `ROLLBACK` in SQL), or still holds the
/// connection when its response is returned, the layer cannot tell what was kept: it answers
/// 500, keeps an entry that says the outcome is unknown (every repeat gets it: the writes may
/// have committed), and logs an error. Until that entry is written the key stays in flight
/// (409): the claim's in-flight row commits with a hand-made `COMMIT`, and a transaction still
/// held keeps its lock. (A `ROLLBACK` by hand followed by writes outside any transaction is the
/// one misuse this cannot see until the handler answers.) A second
/// [`acquire`](KeyTransaction::acquire) while a guard is held fails at once rather than wait
/// for itself. A statement of the handler's that failed aborts the transaction: the layer then
/// rolls back and returns the handler's response as it is, not stored (nothing was committed;
/// a repeat runs again).
///
/// # In PostgreSQL's log
///
/// A repeat that is refused (409 while the first runs) or answered from the entry (the
/// stored response, 422) ends its claim statement with an error of its own making, `invalid input
/// syntax for type integer: "tower-retry-safety: key busy"` (or `key taken`): that is how the
/// lock, the check and `BEGIN` fit in one round trip without leaving a transaction open. With
/// PostgreSQL's default `log_min_error_statement`, each such repeat writes that error and the
/// statement (the key in hex, after its scope's hash if keys are scoped) to the server's log.
///
/// A 5xx response commits like any other, unless
/// [`store_server_errors(false)`](crate::layer::IdempotencyLayer::store_server_errors): then it rolls back
/// and the key stays free. A response too large to store commits with its status and headers
/// only, as in lease mode. A request whose client goes away keeps running until it commits.
///
/// ```no_run
/// use std::convert::Infallible;
/// use bytes::Bytes;
/// use http_body_util::{Either, Full};
/// use tower::{service_fn, ServiceBuilder};
/// use tower_idempotency_keys::{stores::PostgresStore, IdempotencyLayer, KeyTransaction};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// let store = PostgresStore::connect("postgres://app@127.0.0.1:5432/app").await?;
/// store.migrate().await?;
/// let svc = ServiceBuilder::new()
///     .layer(IdempotencyLayer::new(store).atomic())
///     .service(service_fn(|req: http::Request<Either<Full<Bytes>, Full<Bytes>>>| async move {
///         if let Some(tx) = KeyTransaction::of(&req) {
///             let mut conn = tx.acquire().await?;
///             sqlx::query("INSERT INTO orders (note) VALUES ('one')")
///                 .execute(&mut *conn)
///                 .await?;
///         }
///         Ok::<_, Box<dyn std::error::Error + Send + Sync>>(http::Response::new(Full::new(
///             Bytes::from("created"),
///         )))
///     }));
/// # drop(svc);
/// # Ok(()) }
/// ```
///
/// # Clone
///
/// Clones share the pool.
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
#[derive(Clone, Debug)]
pub struct AtomicLayer {
    store: PostgresStore,
    config: Arc<Config>,
}

impl AtomicLayer {
    /// The layer over `store` with the settings of the `IdempotencyLayer` it is made from.
    pub(crate) fn new(store: PostgresStore, config: Arc<Config>) -> AtomicLayer {
        AtomicLayer { store, config }
    }
}

impl<S> Layer<S> for AtomicLayer {
    type Service = AtomicService<S>;

    fn layer(&self, inner: S) -> AtomicService<S> {
        AtomicService {
            inner,
            store: self.store.clone(),
            config: self.config.clone(),
        }
    }
}

/// The service of [`AtomicLayer`]. Like [`IdempotencyService`](crate::service::IdempotencyService),
/// the inner service receives `Request<Either<Full<Bytes>, B>>`.
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
#[derive(Clone, Debug)]
pub struct AtomicService<S> {
    inner: S,
    store: PostgresStore,
    config: Arc<Config>,
}

impl<S> AtomicService<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B, ResBody> Service<Request<B>> for AtomicService<S>
where
    S: Service<Request<InnerBody<B>>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Unpin + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = &self.config;
        // A gRPC call gets the layer's own answers as gRPC statuses (as in lease mode).
        let grpc = tower_retry_safety::wire::grpc::is_call(req.method(), req.headers());
        let key = match key_of(config, &req) {
            Ok(Some(key)) => key,
            Ok(None) => {
                let call = inner.call(req.map(Either::Right));
                return Box::pin(async move {
                    let res = call.await?;
                    Ok(res.map(|body| ResponseBody::stream(Bytes::new(), None, None, body)))
                });
            }
            Err(bad) => {
                config.observe.keyed(req.method(), bad.handling());
                if grpc {
                    return Box::pin(ready(Ok(crate::grpc::answer(bad.reply()))));
                }
                return Box::pin(ready(Ok(bad.reply())));
            }
        };
        let (parts, body) = req.into_parts();
        let call = claim::keyed(
            inner,
            self.store.clone(),
            self.config.clone(),
            key,
            parts,
            body,
        );
        if grpc {
            return Box::pin(async move { call.await.map(crate::grpc::answer) });
        }
        Box::pin(call)
    }
}
