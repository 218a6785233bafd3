//! Lease mode: `PostgresStore` as an `IdempotencyStore`, the protocol `RedisStore` keeps, in
//! one table. Each call is one statement (a claim on a taken key, two), atomic on its own.

use std::time::Duration;

use sqlx::Row;

use super::super::record;
use super::super::store::{
    Begin, Claim, Entry, Fingerprint, IdempotencyStore, StoreError, StoredResponse,
};
use super::{secs, PostgresStore};

/// Claims a free key: absent, or its row expired (a lease that ended, a record past its TTL).
/// On a live row, changes nothing and returns no row.
const BEGIN: &str = "INSERT INTO idempotency_keys AS t (key, claim, completed, record, expires_at)
    VALUES ($1, $2, false, $3, clock_timestamp() + make_interval(secs => $4))
    ON CONFLICT (key) DO UPDATE
        SET claim = excluded.claim, completed = false, record = excluded.record,
            expires_at = excluded.expires_at
        WHERE t.expires_at <= clock_timestamp()
    RETURNING claim";

const GET: &str = "SELECT record FROM idempotency_keys
    WHERE key = $1 AND expires_at > clock_timestamp()";

/// Writes the completed record if the key is in flight under this claim (its lease may have
/// run out), or nothing holds it (absent or expired).
const COMPLETE: &str =
    "INSERT INTO idempotency_keys AS t (key, claim, completed, record, expires_at)
    VALUES ($1, $2, true, $3, clock_timestamp() + make_interval(secs => $4))
    ON CONFLICT (key) DO UPDATE
        SET claim = excluded.claim, completed = true, record = excluded.record,
            expires_at = excluded.expires_at
        WHERE (t.claim = excluded.claim AND NOT t.completed) OR t.expires_at <= clock_timestamp()
    RETURNING claim";

const RENEW: &str =
    "UPDATE idempotency_keys SET expires_at = clock_timestamp() + make_interval(secs => $3)
    WHERE key = $1 AND claim = $2 AND NOT completed AND expires_at > clock_timestamp()";

const RELEASE: &str = "DELETE FROM idempotency_keys
    WHERE key = $1 AND claim = $2 AND NOT completed AND expires_at > clock_timestamp()";

/// A claim's token as PostgreSQL's `bigint`: the same 64 bits.
fn token(claim: Claim) -> i64 {
    i64::from_ne_bytes(claim.token().to_ne_bytes())
}

/// A row's `(completed, record)` as an entry; the record is decoded, never trusted blindly.
pub(super) fn entry(record: &[u8]) -> Result<Entry, StoreError> {
    record::decode(record).map_err(StoreError::new)
}

impl IdempotencyStore for PostgresStore {
    async fn begin(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Result<Begin, StoreError> {
        self.count_claim();
        let claim = Claim::new();
        let in_flight = record::encode_in_flight(claim, fingerprint);
        // A key that expires between the two statements is claimed on the next round.
        for _ in 0..3 {
            let claimed = sqlx::query(BEGIN)
                .bind(key)
                .bind(token(claim))
                .bind(&in_flight)
                .bind(secs(lease))
                .fetch_optional(&self.pool)
                .await
                .map_err(StoreError::new)?;
            if claimed.is_some() {
                return Ok(Begin::Started(claim));
            }
            if let Some(existing) = self.get(key).await? {
                return Ok(Begin::Existing(existing));
            }
        }
        Err(StoreError::new(
            "a key kept expiring between its claim and its read",
        ))
    }

    async fn renew(&self, key: &str, claim: Claim, lease: Duration) -> Result<(), StoreError> {
        let done = sqlx::query(RENEW)
            .bind(key)
            .bind(token(claim))
            .bind(secs(lease))
            .execute(&self.pool)
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
        claim: Claim,
        fingerprint: Fingerprint,
        response: StoredResponse,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let completed =
            record::encode_completed(claim, fingerprint, &response).map_err(StoreError::new)?;
        let done = sqlx::query(COMPLETE)
            .bind(key)
            .bind(token(claim))
            .bind(&completed)
            .bind(secs(ttl))
            .fetch_optional(&self.pool)
            .await
            .map_err(StoreError::new)?;
        if done.is_some() {
            Ok(())
        } else {
            Err(StoreError::fenced())
        }
    }

    async fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        let row = sqlx::query(GET)
            .bind(key)
            .fetch_optional(&self.pool)
            .await
            .map_err(StoreError::new)?;
        let Some(row) = row else { return Ok(None) };
        let record: Vec<u8> = row.try_get("record").map_err(StoreError::new)?;
        entry(&record).map(Some)
    }

    async fn release(&self, key: &str, claim: Claim) -> Result<(), StoreError> {
        let done = sqlx::query(RELEASE)
            .bind(key)
            .bind(token(claim))
            .execute(&self.pool)
            .await
            .map_err(StoreError::new)?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(StoreError::fenced())
        }
    }
}
