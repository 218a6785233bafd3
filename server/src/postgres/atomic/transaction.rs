//! The request's transaction as the handler gets it: one holder at a time, taken back by the
//! layer to commit.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use http::Request;
use sqlx::postgres::{PgConnection, Postgres};
use sqlx::Transaction;
use tokio::sync::{Mutex, OwnedMappedMutexGuard, OwnedMutexGuard};

pub(super) type Slot = Arc<Mutex<Option<Transaction<'static, Postgres>>>>;

/// The transaction of a keyed request in atomic mode, in the request's extensions: the
/// handler's writes go there, and commit with the key's entry.
///
/// ```no_run
/// # use tower_idempotency_keys::KeyTransaction;
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
    pub(super) slot: Slot,
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
/// run `COMMIT` or `ROLLBACK` on it: the layer commits once, with the key's entry.
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
