//! Claiming a key: the statement that takes its lock, checks it and begins the request's
//! transaction with the claim's in-flight row, and the answers to a key already taken.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{Either, Full};
use tokio::sync::Mutex;
use tower_service::Service;

use super::run::{unavailable, Run};
use super::transaction::{KeyTransaction, Slot};
use crate::answers;
use crate::body::ResponseBody;
use crate::derive::RequestKey;
use crate::detach::DetachOnDrop;
use crate::encoding;
use crate::mode::{self, prepare, Config, InnerBody, Keyed};
use crate::observe::KeyHandling;
use crate::postgres::sql::{Sql, LOCKED};
use crate::postgres::{as_bigint, lock_id, secs, PostgresStore};
use crate::store::{self, Fingerprint, IdempotencyStore};
use tower_retry_safety::BoxError;

/// The statement that begins a keyed request's transaction, in one round trip: whether a live
/// entry holds the key (before the lock: a repeat of a completed key never takes it), the
/// key's advisory lock, the same check again (a statement of its own, so its snapshot is taken
/// after the lock was granted and sees the entry of any holder that committed in between),
/// the claim's in-flight row, then `BEGIN`. The first four run in the implicit transaction
/// that `BEGIN` turns into the request's, so the lock, the [`LOCKED`] setting and the row carry
/// over. A busy or taken key fails the statement with a marked error: the implicit transaction
/// ends there, the lock with it, and the connection is left idle and clean.
///
/// Why check before the lock too: PostgreSQL sends an error to the client before it releases
/// the failed transaction's locks, so a repeat refused *after* taking the lock holds it a
/// moment past its answer, and the client's next repeat could meet it and get a needless 409
/// (seen once in 25 runs of the tests, a repeat 4 ms after a stored response was sent).
///
/// Why an in-flight row that only this transaction sees: it commits with the handler's writes
/// in any case, so a handler that ends the transaction itself (`COMMIT`) leaves the key in
/// flight, never free, while the layer notes that its outcome is unknown; and a rollback
/// (an error, a crash) takes it away with the handler's writes. It lives for the TTL: a key
/// whose handler committed by hand and whose server then died stays in flight, not free.
///
/// Only numbers and hex are written into the text: the lock id, the claim, the TTL, the key
/// and the in-flight entry. The decoded key takes the column's collation: `convert_from`'s
/// result would otherwise take the `C` collation of its `name` argument, and the comparison
/// could not use the primary key's index (a scan of the whole table per request: 10 ms at
/// 30,000 rows).
fn claim_statement(sql: &Sql, key: &str, token: i64, in_flight: &[u8], ttl: f64) -> String {
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
         INSERT INTO {table} AS t (key, fencing_token, completed, entry, expires_at) \
            VALUES ({key}, {token}, false, decode('{in_flight}', 'hex'), \
                clock_timestamp() + make_interval(secs => {ttl})) \
            ON CONFLICT (key) DO UPDATE \
                SET fencing_token = excluded.fencing_token, completed = false, entry = excluded.entry, \
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
    /// A live entry holds the key.
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

/// A key that a live entry holds: its stored response, 409 or 422, read outside any transaction.
async fn answer_from_record<B>(
    store: &PostgresStore,
    key: &str,
    fingerprint: Fingerprint,
    config: &Config,
    method: &http::Method,
) -> Response<ResponseBody<B>> {
    let (result, answer) = match IdempotencyStore::get(store, key).await {
        Ok(Some(entry)) => mode::taken(entry, fingerprint, config),
        // Expired since: the next repeat runs.
        Ok(None) => (KeyHandling::InFlight, answers::in_progress()),
        Err(err) => {
            tracing::warn!(error = %err, cause = crate::store::cause(&err), "idempotency (atomic): the key's entry could not be read; answering 503");
            (KeyHandling::StoreError, answers::cannot_track())
        }
    };
    config.observe.keyed(method, result);
    answer
}

pub(super) async fn keyed<S, B, ResBody>(
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
    let Keyed {
        body,
        key,
        fingerprint,
    } = match prepare(&config, &shown, &parts, body).await {
        Ok(keyed) => keyed,
        Err(answer) => {
            config.observe.keyed(&parts.method, KeyHandling::Rejected);
            return Ok(answer);
        }
    };

    // From the claim on, the call runs to its end even if the request goes away (it is
    // detached onto the runtime then): a claim dropped mid-statement could leave its
    // connection in a transaction that sqlx does not know of (its `BEGIN` was sent, its answer
    // not read), and a handler once called runs to its commit.
    let claim = Claiming {
        store,
        config,
        key,
        shown,
        fingerprint,
    };
    DetachOnDrop::new(claim.run(inner, parts, body)).await
}

/// A keyed request about to claim its key.
struct Claiming {
    store: PostgresStore,
    config: Arc<Config>,
    key: Arc<str>,
    shown: Arc<str>,
    fingerprint: Fingerprint,
}

impl Claiming {
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
        let Claiming {
            store,
            config,
            key,
            shown,
            fingerprint,
        } = self;
        store.count_claim();
        let observe = |handling| config.observe.keyed(&parts.method, handling);
        let sql = match store.sql().await {
            Ok(sql) => sql,
            Err(err) => {
                observe(KeyHandling::StoreError);
                tracing::warn!(error = %err, cause = crate::store::cause(&err), "idempotency (atomic): the store's schema could not be read; answering 503");
                return Ok(answers::cannot_track());
            }
        };
        let token = store::FencingToken::new();
        let in_flight = encoding::encode_in_flight(token, fingerprint);
        let begin = claim_statement(&sql, &key, as_bigint(token), &in_flight, secs(config.ttl));
        let tx = match store.pool.begin_with(begin).await {
            Ok(tx) => tx,
            Err(err) => {
                return Ok(match refusal(&err) {
                    Some(Refusal::Busy) => {
                        observe(KeyHandling::InFlight);
                        answers::in_progress()
                    }
                    Some(Refusal::Taken) => {
                        answer_from_record(&store, &key, fingerprint, &config, &parts.method).await
                    }
                    None => {
                        observe(KeyHandling::StoreError);
                        unavailable("no transaction", &err)
                    }
                })
            }
        };
        observe(KeyHandling::Claimed);
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
            token,
            slot,
        };
        run.call(inner, req).await
    }
}
