//! Idempotency keys in PostgreSQL (feature `postgres`, through sqlx): [`PostgresStore`] in
//! lease mode, and [`AtomicLayer`] whose key commits in the handler's own transaction.

mod atomic;
mod lease;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::Executor;

use super::store::StoreError;

pub use atomic::{
    AtomicLayer, AtomicService, KeyTransaction, KeyTransactionGuard, TransactionError,
};

/// The schema: one table, `idempotency_keys`, and its expiry index. Shipped as a file too
/// (`src/server/postgres/schema.sql`), to run with your own migration tool.
pub const SCHEMA: &str = include_str!("schema.sql");

/// Every this many claims, the store deletes a batch of expired rows in the background.
const SWEEP_EVERY: u64 = 128;
/// The rows one sweep deletes at most: twice [`SWEEP_EVERY`], so sweeping outpaces claiming
/// and the table never holds many more expired rows than one batch.
const SWEEP_BATCH: i64 = 256;

/// An [`IdempotencyStore`](super::IdempotencyStore) in PostgreSQL.
///
/// # Two modes
///
/// - **Lease mode**: `IdempotencyLayer::new(store)`. The same protocol as `RedisStore`: a claim
///   is a row with a lease and a fencing token, renewed while the handler runs, and the
///   response is written when it is done. For handlers whose effects are not in this
///   database.
/// - **Atomic mode**: [`IdempotencyLayer::atomic`](super::IdempotencyLayer::atomic). The key is
///   claimed inside a transaction that the handler writes in ([`KeyTransaction`]); the
///   response is written into the key's row in that same transaction, which commits once.
///   A crash before the commit rolls back the key and the handler's writes together. See
///   [`AtomicLayer`].
///
/// # The table
///
/// One table, `idempotency_keys` ([`SCHEMA`]), in the first schema of the connection's
/// `search_path`: apply it with your migration tool or with [`migrate`](Self::migrate). The
/// database's clock decides leases and expiry, so the servers of a fleet need no synchronised
/// clocks. Expired rows are deleted in batches of up to 256 in the background, one batch every
/// 128 claims (so they never pile up), and by [`purge_expired`](Self::purge_expired).
///
/// **Known limits (open):** lease mode and atomic mode on one table do not see each other's
/// claims in flight (an atomic claim writes no row until it commits), so one key must be served
/// by one mode: give each mode a table (a schema) of its own. In atomic mode, a handler that
/// changes `search_path`, commits by hand, or acquires its [`KeyTransaction`] twice breaks the
/// guarantee (the review tests in `tests/review_postgres.rs`, in the repository, show each).
///
/// ```no_run
/// use tower_retry_safety::server::{IdempotencyLayer, PostgresStore};
///
/// # async fn demo() -> Result<(), tower_retry_safety::server::StoreError> {
/// let store = PostgresStore::connect("postgres://app@127.0.0.1:5432/app").await?;
/// store.migrate().await?;
/// // One mode per table: lease mode here; `IdempotencyLayer::new(store).atomic()` for the
/// // other, over a store whose `search_path` names another schema.
/// let lease_mode = IdempotencyLayer::new(store);
/// # drop(lease_mode);
/// # Ok(()) }
/// ```
///
/// # Clone
///
/// Clones share the pool.
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
#[derive(Clone)]
pub struct PostgresStore {
    pub(crate) pool: PgPool,
    claims: Arc<AtomicU64>,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not the pool's options: they hold the connection's password.
        f.debug_struct("PostgresStore").finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects a pool of up to 16 connections to the PostgreSQL at `url`
    /// (`postgres://user@host:port/db`), each call waiting at most 2 s for a connection.
    /// Fails if the URL is invalid or PostgreSQL does not answer.
    pub async fn connect(url: &str) -> Result<PostgresStore, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(2))
            .connect(url)
            .await
            .map_err(StoreError::new)?;
        Ok(Self::from_pool(pool))
    }

    /// A store over a pool of your own (the application's pool: atomic mode's transactions
    /// come from it). The pool's `acquire_timeout` bounds how long a request waits for a
    /// connection before the layer answers 503.
    pub fn from_pool(pool: PgPool) -> PostgresStore {
        PostgresStore {
            pool,
            claims: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies [`SCHEMA`] (creates the table and its index if absent), under an advisory lock
    /// so that servers starting together do not race.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(StoreError::new)?;
        // A constant of this crate's own: "trs-idem" in ASCII.
        tx.execute("SELECT pg_advisory_xact_lock(8391154592093628781)")
            .await
            .map_err(StoreError::new)?;
        tx.execute(sqlx::raw_sql(SCHEMA))
            .await
            .map_err(StoreError::new)?;
        tx.commit().await.map_err(StoreError::new)
    }

    /// Deletes up to `limit` expired rows, oldest first, and returns how many it deleted. Rows
    /// locked by another transaction are skipped, never waited for.
    pub async fn purge_expired(&self, limit: u32) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM idempotency_keys WHERE key = ANY(ARRAY(
                SELECT key FROM idempotency_keys WHERE expires_at <= clock_timestamp()
                ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED))",
        )
        .bind(i64::from(limit))
        .execute(&self.pool)
        .await
        .map_err(StoreError::new)?;
        Ok(done.rows_affected())
    }

    /// Counts a claim; every [`SWEEP_EVERY`]th spawns a sweep of expired rows.
    pub(crate) fn count_claim(&self) {
        if self.claims.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY != SWEEP_EVERY - 1 {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let store = self.clone();
            drop(runtime.spawn(async move {
                if let Err(err) = store.purge_expired(SWEEP_BATCH as u32).await {
                    tracing::warn!(error = %err, cause = super::cause(&err), "idempotency store: deleting expired keys failed");
                }
            }));
        }
    }
}

/// A key's advisory lock id: 64 bits of SHA-256 of the stored key. Two keys that share one
/// (odds of 2^-64 per pair) only make each other wait with 409.
pub(crate) fn lock_id(key: &str) -> i64 {
    let digest = Sha256::new()
        .chain_update(b"tower-retry-safety idempotency lock\0")
        .chain_update(key.as_bytes())
        .finalize();
    let mut id = [0; 8];
    id.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(id)
}

/// A duration in seconds for `make_interval(secs => …)`.
pub(crate) fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}
