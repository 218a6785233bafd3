//! Idempotency keys in PostgreSQL (feature `postgres`, through sqlx): [`PostgresStore`] in
//! lease mode, and [`AtomicLayer`](atomic::AtomicLayer) whose key commits in the handler's own
//! transaction.

pub(crate) mod atomic;
mod lease;
mod sql;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::Executor;
use tokio::sync::OnceCell;

use crate::store::{FencingToken, StoreError};
use sql::Sql;

/// The schema: one table, `idempotency_keys`, and its expiry index. Shipped as a file too
/// (`src/postgres/schema.sql` in this package), to run with your own migration tool.
pub const SCHEMA: &str = include_str!("schema.sql");

/// Every this many claims, the store deletes a batch of expired rows in the background.
const SWEEP_EVERY: u64 = 128;
/// The rows one sweep deletes at most: twice [`SWEEP_EVERY`], so sweeping outpaces claiming
/// and the table never holds many more expired rows than one batch.
const SWEEP_BATCH: i64 = 256;

/// An [`IdempotencyStore`](crate::store::IdempotencyStore) in PostgreSQL.
///
/// # Two modes
///
/// - **Lease mode**: `IdempotencyLayer::new(store)`. The same protocol as `RedisStore`: a claim
///   is a row with a lease and a fencing token, renewed while the handler runs, and the
///   response is written when it is done. For handlers whose effects are not in this
///   database.
/// - **Atomic mode**: [`IdempotencyLayer::atomic`](crate::layer::IdempotencyLayer::atomic). The key is
///   claimed inside a transaction that the handler writes in ([`KeyTransaction`](atomic::KeyTransaction)); the
///   response is written into the key's row in that same transaction, which commits once.
///   A crash before the commit rolls back the key and the handler's writes together. See
///   [`AtomicLayer`](atomic::AtomicLayer).
///
/// # The table
///
/// One table, `idempotency_keys` ([`SCHEMA`]), in one schema: the one named with
/// [`schema`](Self::schema), or else the first schema of the pool's `search_path` (its
/// `current_schema()`) when the store first talks to the database: the `search_path` a
/// session begins with (the connect options', the role's or the server's). A store over a
/// pool whose connections change `search_path` in their session (an `after_connect` hook, or
/// handlers that `SET` it on the application's pool) must be given the schema: it refuses to
/// guess (each request gets 503, and the log says why). Apply it with your
/// migration tool or with [`migrate`](Self::migrate). Every statement names the table by its
/// schema, so a `search_path` changed on a pooled connection (by an atomic-mode handler, or
/// anyone sharing the pool) never sends an entry to another schema's table. The
/// database's clock decides leases and expiry, so the servers of a fleet need no synchronised
/// clocks. Expired rows are deleted in batches of up to 256 in the background, one batch every
/// 128 claims (so they never pile up), and by [`purge_expired`](Self::purge_expired).
///
/// Besides the pool it is given, the store opens up to two connections of its own (from the
/// pool's connect options) for what keeps a lease-mode claim alive and stores its outcome, so
/// that handlers holding the application's pool cannot make a claim lapse.
///
/// Both modes can share the table: a lease-mode claim takes the key's advisory lock for the
/// moment it claims, so a key that an atomic-mode transaction holds is in flight for it too
/// (409), and an atomic claim sees a lease-mode claim's row.
///
/// ```no_run
/// use tower_idempotency_keys::{stores::PostgresStore, IdempotencyLayer};
///
/// # async fn demo() -> Result<(), tower_idempotency_keys::StoreError> {
/// let store = PostgresStore::connect("postgres://app@127.0.0.1:5432/app").await?;
/// store.migrate().await?;
/// let lease_mode = IdempotencyLayer::new(store.clone());
/// let atomic_mode = IdempotencyLayer::new(store).atomic();
/// # drop((lease_mode, atomic_mode));
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
    /// The statements, once the schema is known.
    sql: Arc<OnceCell<Arc<Sql>>>,
    /// The store's own connections, for what keeps a claim alive and stores its outcome (see
    /// `lease.rs`); made at the first use, from the pool's connect options.
    own: Arc<OnceCell<PgPool>>,
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
            sql: Arc::new(OnceCell::new()),
            own: Arc::new(OnceCell::new()),
        }
    }

    /// At most this many connections of the store's own (renewals, completions, releases).
    const OWN_CONNECTIONS: u32 = 2;

    /// The store's own connections: opened as needed from the pool's connect options (its
    /// `after_connect` hook does not run on them; the statements name their schema).
    pub(crate) async fn own_pool(&self) -> &PgPool {
        self.own
            .get_or_init(|| async {
                PgPoolOptions::new()
                    .max_connections(Self::OWN_CONNECTIONS)
                    .min_connections(0)
                    .acquire_timeout(Duration::from_secs(2))
                    .connect_lazy_with((*self.pool.connect_options()).clone())
            })
            .await
    }

    /// Keeps the table in schema `name` (which must exist) rather than in the pool's
    /// `current_schema()`. [`migrate`](Self::migrate) creates the table there.
    pub fn schema(mut self, name: &str) -> PostgresStore {
        self.sql = Arc::new(OnceCell::new_with(Some(Arc::new(Sql::new(name)))));
        self
    }

    /// The statements, their table named by its schema: read once, from a pooled connection
    /// whose `search_path` is still the one its session began with. A connection on which the
    /// session changed it (a handler's `SET search_path`, or the pool's `after_connect`) cannot
    /// say which schema the store's table is in: the store fails until it is named with
    /// [`schema`](Self::schema), rather than guess.
    pub(crate) async fn sql(&self) -> Result<Arc<Sql>, StoreError> {
        self.sql
            .get_or_try_init(|| async {
                let (schema, as_begun): (Option<String>, bool) = sqlx::query_as(
                    "SELECT current_schema(), current_setting('search_path') = \
                     (SELECT reset_val FROM pg_settings WHERE name = 'search_path')",
                )
                .fetch_one(&self.pool)
                .await
                .map_err(StoreError::new)?;
                if !as_begun {
                    return Err(StoreError::new("the pooled connection's search_path was changed in its session, so the store cannot tell which schema holds its table: name it with PostgresStore::schema"));
                }
                let schema = schema.ok_or_else(|| {
                    StoreError::new("the pool's search_path names no schema that exists: create one, or name it with PostgresStore::schema")
                })?;
                Ok(Arc::new(Sql::new(&schema)))
            })
            .await
            .cloned()
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies [`SCHEMA`] (creates the table and its index if absent) in the store's schema,
    /// under an advisory lock so that servers starting together do not race.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let sql = self.sql().await?;
        let mut tx = self.pool.begin().await.map_err(StoreError::new)?;
        tx.execute(sqlx::raw_sql(&format!(
            "SET LOCAL search_path TO {}",
            sql.schema
        )))
        .await
        .map_err(StoreError::new)?;
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
        let done = sqlx::query(&self.sql().await?.purge)
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
                    tracing::warn!(error = %err, cause = crate::store::cause(&err), "idempotency store: deleting expired keys failed");
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

/// A fencing token as PostgreSQL's `bigint`: the same 64 bits.
pub(crate) fn as_bigint(token: FencingToken) -> i64 {
    i64::from_ne_bytes(token.token().to_ne_bytes())
}

/// A duration in seconds for `make_interval(secs => …)`.
pub(crate) fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}
