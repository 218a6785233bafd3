//! The handler's run in the request's transaction, and the commit of its response with the
//! key; or, when the handler ended the transaction itself, the entry of an unknown outcome.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use sqlx::postgres::Postgres;
use sqlx::Transaction;
use tower_service::Service;

use super::transaction::Slot;
use crate::answers::{self, retry_later};
use crate::body::ResponseBody;
use crate::buffer::{buffer, Buffered};
use crate::encoding;
use crate::mode::{whole, Config, InnerBody};
use crate::observe::TransactionResult;
use crate::postgres::sql::{Sql, STILL_LOCKED};
use crate::postgres::{as_bigint, secs, PostgresStore};
use crate::store::{self, Fingerprint};
use tower_retry_safety::BoxError;

/// A claimed key whose handler is about to run in the transaction in `slot`.
#[derive(Clone)]
pub(super) struct Run {
    pub(super) store: PostgresStore,
    pub(super) sql: Arc<Sql>,
    pub(super) config: Arc<Config>,
    pub(super) key: Arc<str>,
    pub(super) shown: Arc<str>,
    pub(super) fingerprint: Fingerprint,
    /// The fencing token of the key's in-flight row, and of the entry written over it.
    pub(super) token: store::FencingToken,
    pub(super) slot: Slot,
}

impl Run {
    pub(super) async fn call<S, B, ResBody>(
        self,
        mut inner: S,
        req: Request<InnerBody<B>>,
    ) -> Result<Response<ResponseBody<ResBody>>, S::Error>
    where
        S: Service<Request<InnerBody<B>>, Response = Response<ResBody>>,
        ResBody: Body<Data = Bytes> + Unpin,
        ResBody::Error: Into<BoxError>,
    {
        // Until the transaction is back: a panic in the handler or its body abandons it.
        let mut armed = Armed(Some(self.clone()));
        let res = match inner.call(req).await {
            Ok(res) => res,
            Err(err) => {
                armed.0 = None;
                return self.handler_failed(err).await;
            }
        };
        let (parts, body) = res.into_parts();
        let buffered = buffer(body, self.config.max_response_bytes).await;
        let (stored, res) = self.keepable(parts, buffered);
        // The transaction back from the handler.
        armed.0 = None;
        let tx = match self.slot.try_lock() {
            Ok(mut slot) => slot.take(),
            Err(_) => None,
        };
        let Some(tx) = tx else {
            return Ok(self.handler_kept_the_transaction(None).await);
        };
        Ok(self.complete(tx, &stored, res).await)
    }

    /// The handler failed: its transaction rolled back (the handler's writes and the key go
    /// together), or, if it cannot be rolled back, an outcome-unknown answer kept.
    async fn handler_failed<E, ResBody>(
        &self,
        err: E,
    ) -> Result<Response<ResponseBody<ResBody>>, E> {
        let tx = self.slot.try_lock().ok().and_then(|mut slot| slot.take());
        let Some(tx) = tx else {
            return Ok(self.handler_kept_the_transaction(None).await);
        };
        if self.abandon(tx).await {
            return Ok(unknown_response());
        }
        Err(err)
    }

    /// What is stored for the handler's response, and the response itself: whole, or its
    /// head only when the body is over the limit.
    fn keepable<ResBody>(
        &self,
        parts: http::response::Parts,
        buffered: Buffered<ResBody>,
    ) -> (store::StoredResponse, Response<ResponseBody<ResBody>>) {
        match buffered {
            Buffered::Whole(bytes, trailers) => {
                let stored = whole(&parts, &bytes, trailers.as_ref());
                (
                    stored,
                    Response::from_parts(parts, ResponseBody::full_with_trailers(bytes, trailers)),
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
                let stored = answers::head_only(parts.status, &parts.headers);
                let res = Response::from_parts(
                    parts,
                    ResponseBody::stream(prefix, trailers, error, rest),
                );
                (stored, res)
            }
        }
    }

    /// The key's entry written in the handler's transaction, and the transaction committed:
    /// `res` when it commits, else what a repeat should know.
    async fn complete<ResBody>(
        &self,
        mut tx: Transaction<'static, Postgres>,
        stored: &store::StoredResponse,
        res: Response<ResponseBody<ResBody>>,
    ) -> Response<ResponseBody<ResBody>> {
        let server_error = answers::is_server_error(stored.status(), stored.headers());
        let entry = if server_error && !self.config.store_server_errors {
            None
        } else {
            self.encoded(stored)
        };
        let Some(entry) = entry else {
            if self.abandon(tx).await {
                return unknown_response();
            }
            return res;
        };
        let written = sqlx::query(&self.sql.atomic_complete)
            .bind(&*self.key)
            .bind(as_bigint(self.token))
            .bind(&entry)
            .bind(secs(self.config.ttl))
            .fetch_optional(&mut *tx)
            .await;
        match written {
            Ok(Some(_)) => {}
            Ok(None) => return self.handler_kept_the_transaction(Some(tx)).await,
            Err(err) if is_aborted(&err) => {
                // A statement of the handler's failed: nothing of this transaction can commit.
                tracing::debug!(key = %self.shown, "idempotency (atomic): the handler's transaction was aborted by a failed statement; its response is returned unstored");
                if self.abandon(tx).await {
                    return unknown_response();
                }
                return res;
            }
            Err(err) => {
                // The transaction is dropped uncommitted: rolled back.
                self.config
                    .observe
                    .transaction(TransactionResult::RolledBack);
                return unavailable("the response could not be stored", &err);
            }
        }
        if let Err(err) = tx.commit().await {
            self.config
                .observe
                .transaction(TransactionResult::CommitUnconfirmed);
            tracing::warn!(error = %err, key = %self.shown, "idempotency (atomic): the commit was not acknowledged; answering 503 (a repeat with this key gets the stored response if it committed, runs again if not)");
            return retry_later(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server could not confirm that this request was saved; send it again with the same Idempotency-Key: you get the stored response if it was, and it runs if it was not",
            );
        }
        self.config
            .observe
            .transaction(TransactionResult::Committed);
        res
    }

    /// The key's entry for `stored`; for a response no entry can hold (over 65,535 headers, a
    /// 4 GiB header), its status only; `None` when not even that can be encoded.
    fn encoded(&self, stored: &store::StoredResponse) -> Option<Vec<u8>> {
        match encoding::encode_completed(self.token, self.fingerprint, stored) {
            Ok(entry) => Some(entry),
            Err(why) => {
                tracing::warn!(key = %self.shown, why, "idempotency (atomic): the response cannot be stored; keeping its status only");
                let head = answers::head_only(stored.status(), &http::HeaderMap::new());
                encoding::encode_completed(self.token, self.fingerprint, &head).ok()
            }
        }
    }

    /// The handler ended the transaction itself (`tx`, back from it), or still holds it
    /// (`None`): what committed is unknown. Keep an entry that says so, so no repeat runs it
    /// again. Until it is written the key stays in flight: its row committed with a hand-made
    /// `COMMIT`, or the transaction still open holds its lock.
    async fn handler_kept_the_transaction<B>(
        &self,
        tx: Option<Transaction<'static, Postgres>>,
    ) -> Response<ResponseBody<B>> {
        self.config.observe.transaction(TransactionResult::Unknown);
        self.log_kept();
        if let Err(err) = self.keep_unknown(tx).await {
            // The key stays in flight (its row committed with the handler's COMMIT) or, if the
            // transaction rolled back after all, free with nothing of it kept.
            tracing::error!(error = %err, key = %self.shown, "idempotency (atomic): the unknown outcome could not be stored either");
        }
        unknown_response()
    }

    fn log_kept(&self) {
        tracing::error!(key = %self.shown, "idempotency (atomic): the handler ended the request's transaction itself (COMMIT or ROLLBACK) or still held it when it answered; its writes may or may not have committed, so the key keeps an unknown outcome (500) and its response is not sent");
    }

    /// Ends `tx`, which the layer will not commit (the handler failed or panicked, a 5xx not
    /// to be stored, a statement that failed): rolled back if it is still the claim's. If the
    /// handler had ended it itself, what it committed is unknown, and the unknown outcome is
    /// kept (`true`): a hand-made `COMMIT` committed the claim's row with the handler's writes,
    /// and a `ROLLBACK` may have been followed by writes outside any transaction.
    async fn abandon(&self, tx: Transaction<'static, Postgres>) -> bool {
        let kept = self.abandon_inner(tx).await;
        self.config.observe.transaction(if kept {
            TransactionResult::Unknown
        } else {
            TransactionResult::RolledBack
        });
        kept
    }

    async fn abandon_inner(&self, mut tx: Transaction<'static, Postgres>) -> bool {
        let still_locked = sqlx::query_scalar::<_, Option<bool>>(STILL_LOCKED)
            .fetch_one(&mut *tx)
            .await;
        let kept = match still_locked {
            Ok(Some(true)) => {
                roll_back(tx).await;
                return false;
            }
            Ok(_) => self.settle_unknown(tx).await,
            Err(_) => {
                // Aborted by a failed statement (a transaction the handler began by hand after
                // its COMMIT, or the claim's own), or the connection failed: roll back, then
                // look for the claim's row, which only a hand-made COMMIT can have committed.
                roll_back(tx).await;
                match self.claim_row_committed().await {
                    Ok(true) => self.write_unknown().await,
                    // Not committed: nothing of the transaction was kept. Unreadable: if the
                    // row is there, it holds the key in flight until its TTL ends.
                    Ok(false) | Err(_) => return false,
                }
            }
        };
        self.log_kept();
        if let Err(err) = kept {
            tracing::error!(error = %err, key = %self.shown, "idempotency (atomic): the unknown outcome could not be stored either");
        }
        true
    }

    async fn claim_row_committed(&self) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar(&self.sql.atomic_claim_committed)
            .bind(&*self.key)
            .bind(as_bigint(self.token))
            .fetch_one(&self.store.pool)
            .await
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
                            tracing::error!(error = %err, key = %run.shown, "idempotency (atomic): the unknown outcome could not be stored");
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
        self.write_unknown().await
    }

    /// Writes the unknown outcome over the claim's row, or where none is left.
    async fn write_unknown(&self) -> Result<(), sqlx::Error> {
        let unknown = answers::unknown();
        let Ok(entry) = encoding::encode_completed(self.token, self.fingerprint, &unknown) else {
            return Ok(());
        };
        sqlx::query(&self.sql.atomic_keep_unknown)
            .bind(&*self.key)
            .bind(as_bigint(self.token))
            .bind(entry)
            .bind(secs(self.config.ttl))
            .execute(&self.store.pool)
            .await
            .map(drop)
    }
}

/// The answer to a request whose handler ended its transaction itself, and to every repeat.
fn unknown_response<B>() -> Response<ResponseBody<B>> {
    answers::reply(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the handler ended the request's database transaction itself, or kept it past its response, so the server cannot tell whether its writes were kept; this key will not run again. Check the resource's state before sending the request again with a new key.",
    )
}

/// A call whose transaction the layer has not taken back yet. Dropped so (the handler or its
/// body panicked, or the runtime dropped the call), it abandons the transaction from a task of
/// its own: a hand-made `COMMIT` before the panic still gets its unknown outcome.
struct Armed(Option<Run>);

impl Drop for Armed {
    fn drop(&mut self) {
        let Some(run) = self.0.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        drop(runtime.spawn(async move {
            let tx = run.slot.clone().lock_owned().await.take();
            if let Some(tx) = tx {
                run.abandon(tx).await;
            }
        }));
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

pub(super) fn unavailable<B>(why: &'static str, err: &sqlx::Error) -> Response<ResponseBody<B>> {
    tracing::warn!(error = %err, "idempotency (atomic): {why}; answering 503");
    answers::cannot_track()
}
