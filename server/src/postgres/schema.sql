-- tower-retry-safety: the table of idempotency keys kept by `PostgresStore` (lease mode) and
-- `AtomicLayer` (atomic mode). Schema version 1.
--
-- Run it with your own migration tool, or call `PostgresStore::migrate`. The table goes to the
-- first schema of the connection's `search_path`. Running it again changes nothing.

CREATE TABLE IF NOT EXISTS idempotency_keys (
    -- The key as stored: the client's key, after a hash of its scope if keys are scoped.
    key           text        PRIMARY KEY,
    -- The fencing token of the claim that holds (or completed) the key.
    fencing_token bigint      NOT NULL,
    -- Whether `entry` holds the stored response (true) or only the claim's fingerprint (false).
    completed     boolean     NOT NULL,
    -- The versioned binary entry: version, kind, fencing token, SHA-256 fingerprint, and for
    -- a completed key the stored response's status, headers and body.
    entry         bytea       NOT NULL,
    -- A claim's lease end, or a completed entry's end of life. A row past it is free.
    expires_at    timestamptz NOT NULL
);

-- Expired rows are deleted in small batches, oldest first.
CREATE INDEX IF NOT EXISTS idempotency_keys_expires_at ON idempotency_keys (expires_at);
