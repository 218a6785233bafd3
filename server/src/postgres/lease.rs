//! Lease mode: `PostgresStore` as an `IdempotencyStore`, the protocol `RedisStore` keeps, in
//! one table. Each call is one statement (a claim on a taken key, two), atomic on its own.
//!
//! Renewals, completions and releases go over connections the store keeps for itself: the
//! pool it was given may be the application's, and handlers that hold its connections would
//! keep a claim from being renewed (it lapses while its handler runs, and a repeat runs it
//! again) or its outcome from being stored. Claims and reads use the pool given: a claim that
//! waits for a connection has run nothing.

use std::time::Duration;

use sqlx::Row;

use super::{as_bigint, lock_id, secs, PostgresStore};
use crate::encoding;
use crate::store::{
    Begin, Entry, FencingToken, Fingerprint, IdempotencyStore, StoreError, StoredResponse,
};

/// A row's `(completed, entry)` as an entry; the entry is decoded, never trusted blindly.
pub(super) fn entry(bytes: &[u8]) -> Result<Entry, StoreError> {
    encoding::decode(bytes).map_err(StoreError::new)
}

impl IdempotencyStore for PostgresStore {
    async fn begin(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Result<Begin, StoreError> {
        self.count_claim();
        let sql = self.sql().await?;
        let token = FencingToken::new();
        let in_flight = encoding::encode_in_flight(token, fingerprint);
        // A key that expires between the two statements is claimed on the next round.
        for _ in 0..3 {
            let row = sqlx::query(&sql.lease_begin)
                .bind(key)
                .bind(as_bigint(token))
                .bind(&in_flight)
                .bind(secs(lease))
                .bind(lock_id(key))
                .fetch_one(&self.pool)
                .await
                .map_err(StoreError::new)?;
            let free: bool = row.try_get("free").map_err(StoreError::new)?;
            let claimed: Option<i64> = row.try_get("fencing_token").map_err(StoreError::new)?;
            if !free {
                // An atomic-mode request holds the key (its row commits with it): in flight.
                return Ok(Begin::Existing(Entry::InFlight { fingerprint }));
            }
            if claimed.is_some() {
                return Ok(Begin::Started(token));
            }
            if let Some(existing) = self.get(key).await? {
                return Ok(Begin::Existing(existing));
            }
        }
        Err(StoreError::new(
            "a key kept expiring between its claim and its read",
        ))
    }

    async fn renew(
        &self,
        key: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let done = sqlx::query(&self.sql().await?.lease_renew)
            .bind(key)
            .bind(as_bigint(token))
            .bind(secs(lease))
            .execute(self.own_pool().await)
            .await
            .map_err(StoreError::new)?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(StoreError::fenced())
        }
    }

    async fn complete(
        &self,
        key: &str,
        token: FencingToken,
        fingerprint: Fingerprint,
        response: StoredResponse,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let completed =
            encoding::encode_completed(token, fingerprint, &response).map_err(StoreError::new)?;
        let done = sqlx::query(&self.sql().await?.lease_complete)
            .bind(key)
            .bind(as_bigint(token))
            .bind(&completed)
            .bind(secs(ttl))
            .fetch_optional(self.own_pool().await)
            .await
            .map_err(StoreError::new)?;
        if done.is_some() {
            Ok(())
        } else {
            Err(StoreError::fenced())
        }
    }

    async fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        let row = sqlx::query(&self.sql().await?.lease_get)
            .bind(key)
            .fetch_optional(&self.pool)
            .await
            .map_err(StoreError::new)?;
        let Some(row) = row else { return Ok(None) };
        let bytes: Vec<u8> = row.try_get("entry").map_err(StoreError::new)?;
        entry(&bytes).map(Some)
    }

    async fn release(&self, key: &str, token: FencingToken) -> Result<(), StoreError> {
        let done = sqlx::query(&self.sql().await?.lease_release)
            .bind(key)
            .bind(as_bigint(token))
            .execute(self.own_pool().await)
            .await
            .map_err(StoreError::new)?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(StoreError::fenced())
        }
    }
}
