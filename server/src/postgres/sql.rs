//! The store's statements, with the table named by its schema: a handler in atomic mode, or
//! anyone sharing the pool, may change `search_path` on a connection the store then uses, and
//! an unqualified name would follow it to another schema's table (an entry written where no
//! repeat looks for it, and the request run again).

/// The statements of one store, for its table `"schema".idempotency_keys`.
#[derive(Debug)]
pub(crate) struct Sql {
    /// The schema, quoted as an identifier.
    pub(crate) schema: String,
    /// `"schema".idempotency_keys`.
    pub(crate) table: String,
    pub(crate) lease_begin: String,
    pub(crate) lease_get: String,
    pub(crate) lease_complete: String,
    pub(crate) lease_renew: String,
    pub(crate) lease_release: String,
    pub(crate) atomic_complete: String,
    pub(crate) atomic_keep_unknown: String,
    pub(crate) atomic_claim_committed: String,
    pub(crate) purge: String,
}

/// Whether the transaction it runs in is still the one that took the key's lock (`true`), or
/// the handler ended that one (`NULL` or `false`).
pub(crate) const STILL_LOCKED: &str =
    "SELECT current_setting('tower_retry_safety.key_locked', true) = 'true'";

/// The transaction-local setting that says this transaction took the key's advisory lock.
/// Set by the statement that takes the lock, read by the one that writes the entry: it is gone
/// once the transaction ends, which is how a handler that ended the transaction itself is
/// caught.
pub(crate) const LOCKED: &str = "tower_retry_safety.key_locked";

/// `name` quoted as an SQL identifier.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

impl Sql {
    pub(crate) fn new(schema: &str) -> Sql {
        let schema = quote_ident(schema);
        let t = format!("{schema}.idempotency_keys");
        Sql {
            lease_begin: lease_begin(&t),
            lease_get: format!(
                "SELECT entry FROM {t} WHERE key = $1 AND expires_at > clock_timestamp()"
            ),
            // Writes the completed entry if the key is in flight under this claim (its lease
            // may have run out), or nothing holds it (absent or expired).
            lease_complete: format!(
                "INSERT INTO {t} AS t (key, fencing_token, completed, entry, expires_at)
                VALUES ($1, $2, true, $3, clock_timestamp() + make_interval(secs => $4))
                ON CONFLICT (key) DO UPDATE
                    SET fencing_token = excluded.fencing_token, completed = true, entry = excluded.entry,
                        expires_at = excluded.expires_at
                    WHERE (t.fencing_token = excluded.fencing_token AND NOT t.completed)
                        OR t.expires_at <= clock_timestamp()
                RETURNING fencing_token"
            ),
            lease_renew: format!(
                "UPDATE {t} SET expires_at = clock_timestamp() + make_interval(secs => $3)
                WHERE key = $1 AND fencing_token = $2 AND NOT completed AND expires_at > clock_timestamp()"
            ),
            lease_release: format!(
                "DELETE FROM {t}
                WHERE key = $1 AND fencing_token = $2 AND NOT completed AND expires_at > clock_timestamp()"
            ),
            // Writes the completed entry over the claim's in-flight row, in the handler's
            // transaction, only if that transaction is still the one that took the lock (no
            // row otherwise).
            atomic_complete: format!(
                "INSERT INTO {t} AS t (key, fencing_token, completed, entry, expires_at)
                SELECT $1, $2, true, $3, clock_timestamp() + make_interval(secs => $4)
                WHERE current_setting('{LOCKED}', true) = 'true'
                ON CONFLICT (key) DO UPDATE
                    SET fencing_token = excluded.fencing_token, completed = true, entry = excluded.entry,
                        expires_at = excluded.expires_at
                RETURNING fencing_token"
            ),
            // After a handler ended the transaction itself: keep an entry that says the outcome
            // is unknown, over the claim's own in-flight row (committed with the handler's
            // COMMIT) or a dead one, never over another's live entry.
            atomic_keep_unknown: format!(
                "INSERT INTO {t} AS t (key, fencing_token, completed, entry, expires_at)
                VALUES ($1, $2, true, $3, clock_timestamp() + make_interval(secs => $4))
                ON CONFLICT (key) DO UPDATE
                    SET fencing_token = excluded.fencing_token, completed = true, entry = excluded.entry,
                        expires_at = excluded.expires_at
                    WHERE t.fencing_token = excluded.fencing_token OR t.expires_at <= clock_timestamp()"
            ),
            // Whether the claim's in-flight row was committed: only a hand-made COMMIT can.
            atomic_claim_committed: format!(
                "SELECT EXISTS (SELECT 1 FROM {t} WHERE key = $1 AND fencing_token = $2 AND NOT completed)"
            ),
            // Rows locked by another transaction are skipped, never waited for.
            purge: format!(
                "DELETE FROM {t} WHERE key = ANY(ARRAY(
                    SELECT key FROM {t} WHERE expires_at <= clock_timestamp()
                    ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED))"
            ),
            schema,
            table: t,
        }
    }
}

/// Claims a free key (absent, or its row expired: a lease that ended, an entry past its TTL)
/// if no atomic-mode transaction holds the key's advisory lock: an atomic claim's row is not
/// visible until it commits, and an insert of the same key would wait for that commit.
/// Returns whether the lock was free, and the claim if taken.
fn lease_begin(t: &str) -> String {
    format!(
        "WITH lock AS (SELECT pg_try_advisory_xact_lock($5) AS free),
                claimed AS (
                    INSERT INTO {t} AS t (key, fencing_token, completed, entry, expires_at)
                    SELECT $1, $2, false, $3, clock_timestamp() + make_interval(secs => $4)
                    FROM lock WHERE lock.free
                    ON CONFLICT (key) DO UPDATE
                        SET fencing_token = excluded.fencing_token, completed = false, entry = excluded.entry,
                            expires_at = excluded.expires_at
                        WHERE t.expires_at <= clock_timestamp()
                    RETURNING fencing_token)
                SELECT (SELECT free FROM lock) AS free, (SELECT fencing_token FROM claimed) AS fencing_token"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_check_reads_the_setting_the_claim_sets() {
        assert!(STILL_LOCKED.contains(&format!("'{LOCKED}'")));
    }

    #[test]
    fn a_schema_name_is_quoted_whatever_it_holds() {
        assert_eq!(quote_ident("tenant_1"), "\"tenant_1\"");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        let sql = Sql::new("x\"; DROP TABLE t; --");
        assert_eq!(sql.table, "\"x\"\"; DROP TABLE t; --\".idempotency_keys");
    }
}
