//! Atomic mode: the key's row commits in the handler's own transaction.

use std::fmt;
use std::future::{ready, Future};
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{Either, Full};
use sqlx::postgres::{PgConnection, Postgres};
use sqlx::Transaction;
use tokio::sync::{Mutex, OwnedMappedMutexGuard, OwnedMutexGuard};
use tower_layer::Layer;
use tower_service::Service;

use super::super::buffer::{buffer, read_body, Buffered, ReadError};
use super::super::derive::RequestKey;
use super::super::detach::DetachOnDrop;
use super::super::layer::Config;
use super::super::outcome;
use super::super::outcome::{replay, reply, retry_later};
use super::super::record;
use super::super::service::scoped_key;
use super::super::store::{self, Entry, Fingerprint, IdempotencyStore, StoredResponse};
use super::super::{IdempotencyLayer, ResponseBody};
use super::sql::{Sql, LOCKED};
use super::{lock_id, secs, token, PostgresStore};
use crate::classify::idempotency_key;
use crate::BoxError;

impl IdempotencyLayer<PostgresStore> {
    /// Atomic mode: the key is claimed inside a PostgreSQL transaction that the handler
    /// writes in, and its response commits in that same transaction. See [`AtomicLayer`].
    /// Every setting of this layer carries over, except the lease (a transaction holds the
    /// key, not a lease).
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn atomic(self) -> AtomicLayer {
        AtomicLayer {
            store: (*self.store).clone(),
            config: self.config,
        }
    }
}

/// Idempotency keys that commit in the handler's own transaction (atomic mode of
/// [`PostgresStore`]), made by [`IdempotencyLayer::atomic`].
///
/// For a request with a key, the layer:
///
/// 1. takes the key's **advisory transaction lock** with `pg_try_advisory_xact_lock`, which
///    never waits: a repeat while the first runs (on this server or another) gets **409** at
///    once;
/// 2. checks, under the lock, that no live record holds the key, and begins the transaction
///    (steps 1 and 2 are one round trip); a completed record is replayed (422 if the request
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
/// - the commit is acknowledged: a repeat gets the replay;
/// - the database fails at any point (the key cannot be read, the record cannot be written,
///   the commit is not acknowledged): **503** with `Retry-After`. Repeating the same key is
///   safe whatever happened: a commit that went through is replayed, one that did not runs
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
/// sends the key [derived](super::super::RequestKey::derive) from the request's: then the
/// provider replays. A handler whose process died keeps nothing, so this is the window the
/// derived keys close.
///
/// # A handler must leave the transaction to the layer
///
/// A handler gets the connection, not the transaction: it cannot commit or drop it through
/// the API. If it ends it by hand (`COMMIT` or `ROLLBACK` in SQL), or still holds the
/// connection when its response is returned, the layer cannot tell what was kept: it answers
/// 500, keeps a record that says the outcome is unknown (every repeat gets it: the writes may
/// have committed), and logs an error. Until that record is written the key stays in flight
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
/// A repeat that is refused (409 while the first runs) or answered from the record (the
/// replay, 422) ends its claim statement with an error of its own making, `invalid input
/// syntax for type integer: "tower-retry-safety: key busy"` (or `key taken`): that is how the
/// lock, the check and `BEGIN` fit in one round trip without leaving a transaction open. With
/// PostgreSQL's default `log_min_error_statement`, each such repeat writes that error and the
/// statement (the key in hex, after its scope's hash if keys are scoped) to the server's log.
///
/// A 5xx response commits like any other, unless
/// [`store_server_errors(false)`](IdempotencyLayer::store_server_errors): then it rolls back
/// and the key stays free. A response too large to store commits with its status and headers
/// only, as in lease mode. A request whose client goes away keeps running until it commits.
///
/// ```no_run
/// use std::convert::Infallible;
/// use bytes::Bytes;
/// use http_body_util::{Either, Full};
/// use tower::{service_fn, ServiceBuilder};
/// use tower_retry_safety::server::{IdempotencyLayer, KeyTransaction, PostgresStore};
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

/// The service of [`AtomicLayer`]. Like [`IdempotencyService`](super::super::IdempotencyService),
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

type Slot = Arc<Mutex<Option<Transaction<'static, Postgres>>>>;

/// The transaction of a keyed request in atomic mode, in the request's extensions: the
/// handler's writes go there, and commit with the key's record.
///
/// ```no_run
/// # use tower_retry_safety::server::KeyTransaction;
/// # async fn handler(req: http::Request<()>) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// let tx = KeyTransaction::of(&req).ok_or("not a keyed request")?;
/// let mut conn = tx.acquire().await?;
/// sqlx::query("UPDATE accounts SET balance = balance - 5 WHERE id = 1")
///     .execute(&mut *conn)
///     .await?;
/// # Ok(()) }
/// ```
///
/// # Clone
///
/// Clones share the transaction.
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
#[derive(Clone)]
pub struct KeyTransaction {
    slot: Slot,
}

impl fmt::Debug for KeyTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyTransaction").finish_non_exhaustive()
    }
}

impl KeyTransaction {
    /// The request's transaction, if the atomic layer handed it one (a keyed request).
    pub fn of<B>(req: &Request<B>) -> Option<&KeyTransaction> {
        req.extensions().get()
    }

    /// The transaction's connection, to run statements in it. Drop the guard before returning
    /// the response.
    ///
    /// One holder at a time, and no waiting: fails at once while another guard is held (a
    /// second `acquire` in the same handler would otherwise wait for itself forever, holding
    /// the key and a connection), and once the layer has taken the transaction back to commit
    /// it. Tasks that share the transaction take turns: a transaction runs one statement at a
    /// time anyway.
    pub async fn acquire(&self) -> Result<KeyTransactionGuard, TransactionError> {
        let guard = self
            .slot
            .clone()
            .try_lock_owned()
            .map_err(|_| TransactionError(Why::Held))?;
        OwnedMutexGuard::try_map(guard, Option::as_mut)
            .map(KeyTransactionGuard)
            .map_err(|_| TransactionError(Why::TakenBack))
    }
}

/// The connection of a [`KeyTransaction`], held: use `&mut *guard` as a sqlx executor. Do not
/// run `COMMIT` or `ROLLBACK` on it: the layer commits once, with the key's record.
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub struct KeyTransactionGuard(
    OwnedMappedMutexGuard<Option<Transaction<'static, Postgres>>, Transaction<'static, Postgres>>,
);

impl fmt::Debug for KeyTransactionGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyTransactionGuard")
            .finish_non_exhaustive()
    }
}

impl Deref for KeyTransactionGuard {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.0
    }
}

impl DerefMut for KeyTransactionGuard {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.0
    }
}

/// [`KeyTransaction::acquire`] failed: another guard holds the transaction, or the layer took
/// it back (the handler's response was returned: a task of the handler's that outlived it?).
#[derive(Debug)]
pub struct TransactionError(Why);

#[derive(Debug)]
enum Why {
    Held,
    TakenBack,
}

impl TransactionError {
    /// Another [`KeyTransactionGuard`] of this request holds the transaction.
    pub fn is_held(&self) -> bool {
        matches!(self.0, Why::Held)
    }

    /// The layer took the transaction back: the handler's response was returned.
    pub fn is_taken_back(&self) -> bool {
        matches!(self.0, Why::TakenBack)
    }
}

impl fmt::Display for TransactionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            Why::Held => "the request's transaction is held by another KeyTransactionGuard: drop it before acquiring the transaction again",
            Why::TakenBack => "the request's transaction was already taken back by the idempotency layer: its response was returned",
        })
    }
}

impl std::error::Error for TransactionError {}

type InnerBody<B> = Either<Full<Bytes>, B>;

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
        let Some(value) = req.headers().get(&config.key_header) else {
            if config.required.contains(req.method()) {
                return Box::pin(ready(Ok(reply(
                    StatusCode::BAD_REQUEST,
                    "this request needs an Idempotency-Key header: a quoted string, such as \
                     \"8e03978e-40d5-43e8-bc93-6894a57f9324\"",
                ))));
            }
            let call = inner.call(req.map(Either::Right));
            return Box::pin(async move {
                let res = call.await?;
                Ok(res.map(|body| ResponseBody::stream(Bytes::new(), None, None, body)))
            });
        };
        let Some(key) = idempotency_key::parse(value) else {
            return Box::pin(ready(Ok(reply(
                StatusCode::BAD_REQUEST,
                "malformed Idempotency-Key: expected a quoted string (RFC 8941 sf-string) of \
                 printable ASCII, or a bare token of visible ASCII without quotes or backslashes; \
                 non-empty, at most 255 bytes",
            ))));
        };
        let key: Arc<str> = key.into();
        let (parts, body) = req.into_parts();
        Box::pin(keyed(
            inner,
            self.store.clone(),
            self.config.clone(),
            key,
            parts,
            body,
        ))
    }
}

/// The statement that begins a keyed request's transaction, in one round trip: whether a live
/// record holds the key (before the lock: a repeat of a completed key never takes it), the
/// key's advisory lock, the same check again (a statement of its own, so its snapshot is taken
/// after the lock was granted and sees the record of any holder that committed in between),
/// the claim's in-flight row, then `BEGIN`. The first four run in the implicit transaction
/// that `BEGIN` turns into the request's, so the lock, the [`LOCKED`] setting and the row carry
/// over. A busy or taken key fails the statement with a marked error: the implicit transaction
/// ends there, the lock with it, and the connection is left idle and clean.
///
/// Why check before the lock too: PostgreSQL sends an error to the client before it releases
/// the failed transaction's locks, so a repeat refused *after* taking the lock holds it a
/// moment past its answer, and the client's next repeat could meet it and get a needless 409
/// (seen once in 25 runs of the tests, a repeat 4 ms after a replay).
///
/// Why an in-flight row that only this transaction sees: it commits with the handler's writes
/// in any case, so a handler that ends the transaction itself (`COMMIT`) leaves the key in
/// flight, never free, while the layer records that its outcome is unknown; and a rollback
/// (an error, a crash) takes it away with the handler's writes. It lives for the TTL: a key
/// whose handler committed by hand and whose server then died stays in flight, not free.
///
/// Only numbers and hex are written into the text: the lock id, the claim, the TTL, the key
/// and the in-flight record. The decoded key takes the column's collation: `convert_from`'s
/// result would otherwise take the `C` collation of its `name` argument, and the comparison
/// could not use the primary key's index (a scan of the whole table per request: 10 ms at
/// 30,000 rows).
fn claim_statement(sql: &Sql, key: &str, claim: i64, in_flight: &[u8], ttl: f64) -> String {
    let lock = lock_id(key);
    let (key, in_flight) = (hex(key.as_bytes()), hex(in_flight));
    let table = &sql.table;
    let key = format!("convert_from(decode('{key}', 'hex'), 'UTF8') COLLATE \"default\"");
    let taken = format!(
        "SELECT (CASE WHEN EXISTS (SELECT 1 FROM {table} \
            WHERE key = {key} AND expires_at > clock_timestamp()) THEN '{TAKEN}' ELSE '0' END)::int"
    );
    format!(
        "{taken}; \
         SELECT (CASE WHEN pg_try_advisory_xact_lock({lock}) \
            THEN length(set_config('{LOCKED}', 'true', true))::text ELSE '{BUSY}' END)::int; \
         {taken}; \
         INSERT INTO {table} AS t (key, claim, completed, record, expires_at) \
            VALUES ({key}, {claim}, false, decode('{in_flight}', 'hex'), \
                clock_timestamp() + make_interval(secs => {ttl})) \
            ON CONFLICT (key) DO UPDATE \
                SET claim = excluded.claim, completed = false, record = excluded.record, \
                    expires_at = excluded.expires_at \
                WHERE t.expires_at <= clock_timestamp(); \
         BEGIN"
    )
}

fn hex(bytes: &[u8]) -> String {
    let mut hex = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        hex.push(char::from(HEX[usize::from(b >> 4)]));
        hex.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    hex
}

const HEX: &[u8; 16] = b"0123456789abcdef";
/// The marks of [`claim_statement`]'s two refusals: values that fail a cast to `int` (the
/// error quotes them, in every language the server speaks).
const BUSY: &str = "tower-retry-safety: key busy";
const TAKEN: &str = "tower-retry-safety: key taken";

enum Refusal {
    /// Another transaction holds the key's lock.
    Busy,
    /// A live record holds the key.
    Taken,
}

fn refusal(err: &sqlx::Error) -> Option<Refusal> {
    let err = err.as_database_error()?;
    if err.code().as_deref() != Some("22P02") {
        return None;
    }
    let message = err.message();
    if message.contains(BUSY) {
        Some(Refusal::Busy)
    } else if message.contains(TAKEN) {
        Some(Refusal::Taken)
    } else {
        None
    }
}

fn in_progress<B>() -> Response<ResponseBody<B>> {
    retry_later(
        StatusCode::CONFLICT,
        "a request with this Idempotency-Key is still in progress; retry later",
    )
}

/// A key that a live record holds: its replay, 409 or 422, read outside any transaction.
async fn answer_from_record<B>(
    store: &PostgresStore,
    key: &str,
    fingerprint: Fingerprint,
    config: &Config,
) -> Response<ResponseBody<B>> {
    match IdempotencyStore::get(store, key).await {
        Ok(Some(Entry::Completed {
            fingerprint: first,
            response,
        })) if first == fingerprint => replay(response, config),
        Ok(Some(Entry::InFlight { fingerprint: first })) if first == fingerprint => in_progress(),
        // Expired since: the next repeat runs.
        Ok(None) => in_progress(),
        Ok(Some(_)) => reply(
            StatusCode::UNPROCESSABLE_ENTITY,
            "this Idempotency-Key was already used with a different request",
        ),
        Err(err) => {
            tracing::warn!(error = %err, cause = super::super::cause(&err), "idempotency (atomic): the key's record could not be read; answering 503");
            retry_later(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server cannot track this Idempotency-Key right now; nothing was applied, retry later",
            )
        }
    }
}

fn unavailable<B>(why: &'static str, err: &sqlx::Error) -> Response<ResponseBody<B>> {
    tracing::warn!(error = %err, "idempotency (atomic): {why}; answering 503");
    retry_later(
        StatusCode::SERVICE_UNAVAILABLE,
        "the server cannot track this Idempotency-Key right now; nothing was applied, retry later",
    )
}

async fn keyed<S, B, ResBody>(
    inner: S,
    store: PostgresStore,
    config: Arc<Config>,
    shown: Arc<str>,
    parts: http::request::Parts,
    body: B,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<InnerBody<B>>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Unpin + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let body = match read_body(body, config.max_request_bytes).await {
        Ok(body) => body,
        Err(ReadError::TooLarge) => {
            return Ok(reply(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the request body is larger than this server keeps for idempotency keys",
            ))
        }
        Err(ReadError::Failed) => {
            return Ok(reply(
                StatusCode::BAD_REQUEST,
                "the request body could not be read",
            ))
        }
    };
    let key: Arc<str> = match &config.scope {
        None => shown.clone(),
        Some(scope) => match (scope.0)(&parts) {
            Some(scope) => scoped_key(&scope, &shown).into(),
            None => {
                return Ok(reply(
                    StatusCode::BAD_REQUEST,
                    "this server scopes Idempotency-Keys by client, and the request does not say which client sent it",
                ))
            }
        },
    };
    let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let fingerprint = Fingerprint::of(&parts.method, target, &body);

    // From the claim on, the call runs to its end even if the request goes away (it is
    // detached onto the runtime then): a claim dropped mid-statement could leave its
    // connection in a transaction that sqlx does not know of (its `BEGIN` was sent, its answer
    // not read), and a handler once called runs to its commit.
    let claim = Claim {
        store,
        config,
        key,
        shown,
        fingerprint,
    };
    DetachOnDrop::new(claim.run(inner, parts, body)).await
}

/// A keyed request about to claim its key.
struct Claim {
    store: PostgresStore,
    config: Arc<Config>,
    key: Arc<str>,
    shown: Arc<str>,
    fingerprint: Fingerprint,
}

impl Claim {
    async fn run<S, B, ResBody>(
        self,
        inner: S,
        mut parts: http::request::Parts,
        body: Bytes,
    ) -> Result<Response<ResponseBody<ResBody>>, S::Error>
    where
        S: Service<Request<InnerBody<B>>, Response = Response<ResBody>>,
        ResBody: Body<Data = Bytes> + Unpin,
        ResBody::Error: Into<BoxError>,
    {
        let Claim {
            store,
            config,
            key,
            shown,
            fingerprint,
        } = self;
        store.count_claim();
        let sql = match store.sql().await {
            Ok(sql) => sql,
            Err(err) => {
                tracing::warn!(error = %err, cause = super::super::cause(&err), "idempotency (atomic): the store's schema could not be read; answering 503");
                return Ok(retry_later(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the server cannot track this Idempotency-Key right now; nothing was applied, retry later",
                ));
            }
        };
        let claim = store::Claim::new();
        let in_flight = record::encode_in_flight(claim, fingerprint);
        let begin = claim_statement(&sql, &key, token(claim), &in_flight, secs(config.ttl));
        let tx = match store.pool.begin_with(begin).await {
            Ok(tx) => tx,
            Err(err) => {
                return Ok(match refusal(&err) {
                    Some(Refusal::Busy) => in_progress(),
                    Some(Refusal::Taken) => {
                        answer_from_record(&store, &key, fingerprint, &config).await
                    }
                    None => unavailable("no transaction", &err),
                })
            }
        };
        // The handler runs in the transaction.
        let slot: Slot = Arc::new(Mutex::new(Some(tx)));
        parts
            .extensions
            .insert(KeyTransaction { slot: slot.clone() });
        parts
            .extensions
            .insert(RequestKey::new(key.clone(), shown.clone()));
        let req = Request::from_parts(parts, Either::Left(Full::new(body)));
        let run = Run {
            store,
            sql,
            config,
            key,
            shown,
            fingerprint,
            claim,
            slot,
        };
        run.call(inner, req).await
    }
}

/// A claimed key whose handler is about to run in the transaction in `slot`.
#[derive(Clone)]
struct Run {
    store: PostgresStore,
    sql: Arc<Sql>,
    config: Arc<Config>,
    key: Arc<str>,
    shown: Arc<str>,
    fingerprint: Fingerprint,
    /// The claim of the key's in-flight row, and of the record written over it.
    claim: store::Claim,
    slot: Slot,
}

impl Run {
    async fn call<S, B, ResBody>(
        self,
        mut inner: S,
        req: Request<InnerBody<B>>,
    ) -> Result<Response<ResponseBody<ResBody>>, S::Error>
    where
        S: Service<Request<InnerBody<B>>, Response = Response<ResBody>>,
        ResBody: Body<Data = Bytes> + Unpin,
        ResBody::Error: Into<BoxError>,
    {
        // A panic unwinds through here: the transaction is dropped with `slot`, and rolls back.
        let res = match inner.call(req).await {
            Ok(res) => res,
            Err(err) => {
                // Rolled back: the handler's writes and the key go together.
                let tx = self.slot.try_lock().ok().and_then(|mut slot| slot.take());
                if let Some(tx) = tx {
                    roll_back(tx).await;
                }
                return Err(err);
            }
        };
        let (parts, body) = res.into_parts();
        let (stored, res) = match buffer(body, self.config.max_response_bytes).await {
            Buffered::Whole(bytes) => {
                let stored =
                    StoredResponse::new(parts.status, parts.headers.clone(), bytes.clone());
                (
                    stored,
                    Response::from_parts(parts, ResponseBody::full(bytes)),
                )
            }
            Buffered::Partial {
                prefix,
                trailers,
                error,
                rest,
                why,
            } => {
                tracing::warn!(key = %self.shown, why, "idempotency (atomic): the response is not stored whole; repeats get its status and headers only");
                let stored = outcome::head_only(parts.status, &parts.headers);
                let res = Response::from_parts(
                    parts,
                    ResponseBody::stream(prefix, trailers, error, rest),
                );
                (stored, res)
            }
        };
        // The transaction back from the handler.
        let tx = match self.slot.try_lock() {
            Ok(mut slot) => slot.take(),
            Err(_) => None,
        };
        let Some(mut tx) = tx else {
            return Ok(self.handler_kept_the_transaction(None).await);
        };
        if stored.status().is_server_error() && !self.config.store_server_errors {
            roll_back(tx).await;
            return Ok(res);
        }
        let claim = self.claim;
        let record = match record::encode_completed(claim, self.fingerprint, &stored) {
            Ok(record) => record,
            Err(why) => {
                // A response no record can hold (over 65,535 headers, a 4 GiB header): keep
                // what can be said.
                tracing::warn!(key = %self.shown, why, "idempotency (atomic): the response cannot be recorded; keeping its status only");
                let head = outcome::head_only(stored.status(), &http::HeaderMap::new());
                match record::encode_completed(claim, self.fingerprint, &head) {
                    Ok(record) => record,
                    Err(_) => return Ok(res),
                }
            }
        };
        let written = sqlx::query(&self.sql.atomic_complete)
            .bind(&*self.key)
            .bind(token(claim))
            .bind(&record)
            .bind(secs(self.config.ttl))
            .fetch_optional(&mut *tx)
            .await;
        match written {
            Ok(Some(_)) => {}
            Ok(None) => return Ok(self.handler_kept_the_transaction(Some(tx)).await),
            Err(err) if is_aborted(&err) => {
                // A statement of the handler's failed: nothing of this transaction can commit.
                tracing::debug!(key = %self.shown, "idempotency (atomic): the handler's transaction was aborted by a failed statement; its response is returned unstored");
                roll_back(tx).await;
                return Ok(res);
            }
            Err(err) => return Ok(unavailable("the response could not be recorded", &err)),
        }
        if let Err(err) = tx.commit().await {
            tracing::warn!(error = %err, key = %self.shown, "idempotency (atomic): the commit was not acknowledged; answering 503 (a repeat with this key is replayed if it committed, runs again if not)");
            return Ok(retry_later(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server could not confirm that this request was saved; send it again with the same Idempotency-Key: it is replayed if it was, and runs if it was not",
            ));
        }
        Ok(res)
    }

    /// The handler ended the transaction itself (`tx`, back from it), or still holds it
    /// (`None`): what committed is unknown. Keep a record that says so, so no repeat runs it
    /// again. Until it is written the key stays in flight: its row committed with a hand-made
    /// `COMMIT`, or the transaction still open holds its lock.
    async fn handler_kept_the_transaction<B>(
        &self,
        tx: Option<Transaction<'static, Postgres>>,
    ) -> Response<ResponseBody<B>> {
        tracing::error!(key = %self.shown, "idempotency (atomic): the handler ended the request's transaction itself (COMMIT or ROLLBACK) or still held it when it answered; its writes may or may not have committed, so the key keeps an unknown outcome (500) and its response is not sent");
        if let Err(err) = self.keep_unknown(tx).await {
            // The key stays in flight (its row committed with the handler's COMMIT) or, if the
            // transaction rolled back after all, free with nothing of it kept.
            tracing::error!(error = %err, key = %self.shown, "idempotency (atomic): the unknown outcome could not be recorded either");
        }
        let mut res = Response::new(ResponseBody::full(Bytes::from_static(
            b"the handler ended the request's database transaction itself, or kept it past its response, so the server cannot tell whether its writes were kept; this key will not run again. Check the resource's state before sending the request again with a new key.",
        )));
        *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        res.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        res
    }

    /// Writes the unknown outcome over the claim's row, once the transaction is ours again:
    /// `tx` (the handler ended it), or what a task of the handler's still holds (waited for at
    /// most [`HOLDER_WAIT`] here, then from a task of its own: the response is not held up by
    /// it). Until then the key stays in flight: the open transaction holds its lock.
    async fn keep_unknown(
        &self,
        tx: Option<Transaction<'static, Postgres>>,
    ) -> Result<(), sqlx::Error> {
        if let Some(tx) = tx {
            return self.settle_unknown(tx).await;
        }
        let slot = self.slot.clone();
        match tokio::time::timeout(HOLDER_WAIT, slot.lock_owned()).await {
            Ok(mut held) => match held.take() {
                Some(tx) => self.settle_unknown(tx).await,
                None => Ok(()),
            },
            Err(_) => {
                let run = self.clone();
                drop(tokio::spawn(async move {
                    let tx = run.slot.clone().lock_owned().await.take();
                    if let Some(tx) = tx {
                        if let Err(err) = run.settle_unknown(tx).await {
                            tracing::error!(error = %err, key = %run.shown, "idempotency (atomic): the unknown outcome could not be recorded");
                        }
                    }
                }));
                Ok(())
            }
        }
    }

    /// Ends `tx` (a rollback: whatever of it the handler did not commit itself is not kept),
    /// then writes the unknown outcome over the claim's row (committed with a hand-made
    /// `COMMIT`) or where none is left.
    async fn settle_unknown(&self, tx: Transaction<'static, Postgres>) -> Result<(), sqlx::Error> {
        // After a hand-made COMMIT this rolls back nothing (a warning in PostgreSQL's log).
        tx.rollback().await?;
        let unknown = outcome::unknown();
        let Ok(record) = record::encode_completed(self.claim, self.fingerprint, &unknown) else {
            return Ok(());
        };
        sqlx::query(&self.sql.atomic_keep_unknown)
            .bind(&*self.key)
            .bind(token(self.claim))
            .bind(record)
            .bind(secs(self.config.ttl))
            .execute(&self.store.pool)
            .await
            .map(drop)
    }
}

/// Rolls back before answering, so that a repeat the client sends at once finds the key's lock
/// released (a dropped transaction rolls back only when its connection goes back to the pool,
/// from a task). A rollback that fails ends the connection, and the lock with it.
async fn roll_back(tx: Transaction<'static, Postgres>) {
    if let Err(err) = tx.rollback().await {
        tracing::debug!(error = %err, "idempotency (atomic): rollback failed");
    }
}

/// How long a response waits for a task of the handler's that still holds the transaction.
const HOLDER_WAIT: Duration = Duration::from_secs(2);

/// `25P02`: the transaction was aborted by an earlier failed statement.
fn is_aborted(err: &sqlx::Error) -> bool {
    err.as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "25P02")
}
