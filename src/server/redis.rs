//! `RedisStore`: idempotency keys shared by a fleet of servers through Redis.

use std::fmt;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Script, Value};

use super::record;
use super::store::{
    Begin, Claim, Entry, Fingerprint, IdempotencyStore, StoreError, StoredResponse,
};

/// Compare-and-set on the claim, then act: every script reads and writes one key only, so it
/// runs unchanged on Redis Cluster and Valkey. `ARGV[1]` is the claim's record prefix
/// (version, kind, token: `record::HOLDER_LEN` bytes), compared at its own length, so the
/// scripts hold no copy of the record format.
///
/// `COMPLETE` writes the completed record (`ARGV[2]`) if the key holds the claim, or nothing
/// (the claim's lease ran out and no one claimed the key since: the outcome is kept, not lost).
const COMPLETE: &str = r"
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1";

const RENEW: &str = r"
local v = redis.call('GET', KEYS[1])
if (not v) or string.sub(v, 1, #ARGV[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1";

const RELEASE: &str = r"
local v = redis.call('GET', KEYS[1])
if (not v) or string.sub(v, 1, #ARGV[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1";

/// An [`IdempotencyStore`] in Redis (or Valkey, 7.0 or later), for a fleet of servers behind
/// a load balancer: a retry that lands on another instance, or on a restarted one, finds the
/// key where the first attempt left it.
///
/// - A claim is `SET key record NX PX lease GET`: one atomic command that claims a free key
///   and returns what a taken one holds. The claim's lease is its expiry, renewed while the
///   handler runs; a crashed server's claim ends with its lease.
/// - `complete`, `renew` and `release` are Lua scripts that compare the record's claim token
///   (fencing) before they write, so a server whose claim was taken over changes nothing. Each
///   script touches one key: it runs unchanged on Redis Cluster.
/// - Records use a compact, versioned binary encoding (see the crate's `server` docs). A record
///   of a version this server does not read is an error: the layer answers 503 and logs it,
///   never misreads it.
/// - Keys are only as durable as Redis keeps them: run it with `maxmemory-policy noeviction`
///   and with persistence or a replica set you trust for failover, or a lost record lets a
///   repeat run its handler again (see the `server` module's "Leases and fencing").
/// - The connection is redis-rs's tokio `ConnectionManager`: a lost connection is
///   re-established on its own. While Redis is unreachable every call fails fast (a 1 s
///   response timeout by default) and the layer answers 503 with `Retry-After`, running
///   nothing; service resumes when Redis is back, without a restart.
///
/// ```no_run
/// use tower_retry_safety::server::{IdempotencyLayer, RedisStore};
///
/// # async fn demo() -> Result<(), tower_retry_safety::server::StoreError> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379").await?.prefix("myapp:idem:");
/// let layer = IdempotencyLayer::new(store);
/// # drop(layer);
/// # Ok(()) }
/// ```
///
/// # Clone
///
/// Clones share the connection.
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[derive(Clone)]
pub struct RedisStore {
    connection: ConnectionManager,
    prefix: String,
    complete: Script,
    renew: Script,
    release: Script,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to the Redis at `url` (`redis://host:port/db`, `rediss://` for TLS if redis-rs
    /// was built with TLS), with a 1 s connection and response timeout and the key prefix
    /// `idempotency:`. Fails if the URL is invalid or Redis does not answer.
    pub async fn connect(url: &str) -> Result<RedisStore, StoreError> {
        Self::connect_with(url, Duration::from_secs(1)).await
    }

    /// [`connect`](Self::connect) with another connection and response timeout: how long a
    /// call may wait for Redis before the layer answers 503.
    pub async fn connect_with(url: &str, timeout: Duration) -> Result<RedisStore, StoreError> {
        let client = redis::Client::open(url).map_err(StoreError::new)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            // Reconnect on the next call rather than hold requests through a long backoff:
            // a call during an outage should fail fast into a 503.
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(100));
        let connection = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(StoreError::new)?;
        Ok(RedisStore {
            connection,
            prefix: "idempotency:".to_owned(),
            complete: Script::new(COMPLETE),
            renew: Script::new(RENEW),
            release: Script::new(RELEASE),
        })
    }

    /// The prefix of every Redis key this store writes.
    ///
    /// Defaults to `idempotency:`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    fn key(&self, key: &str) -> String {
        // Not `format!`: its machinery costs more than the copy, on every call.
        let mut out = String::with_capacity(self.prefix.len() + key.len());
        out.push_str(&self.prefix);
        out.push_str(key);
        out
    }

    /// Runs a compare-and-set script; `Ok(())` if the claim held the key.
    async fn held(
        &self,
        script: &Script,
        key: &str,
        claim: Claim,
        arg: &[&[u8]],
    ) -> Result<(), StoreError> {
        let mut invocation = script.key(self.key(key));
        invocation.arg(&record::in_flight_holder(claim)[..]);
        for a in arg {
            invocation.arg(*a);
        }
        let held: i64 = invocation
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(StoreError::new)?;
        if held == 1 {
            Ok(())
        } else {
            Err(StoreError::fenced())
        }
    }
}

/// An expiry for `PX`/`PEXPIRE`: at least 1 ms (Redis refuses 0), at most a century (Redis
/// refuses one that overflows when added to its clock).
fn millis(d: Duration) -> Millis {
    const CENTURY_MS: u128 = 100 * 365 * 24 * 60 * 60 * 1000;
    // At most a century: fits in a u64, and in 20 digits.
    let mut n = d.as_millis().clamp(1, CENTURY_MS) as u64;
    let mut digits = [0; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    Millis { digits, start }
}

/// A number of milliseconds in decimal, without an allocation per call.
struct Millis {
    digits: [u8; 20],
    start: usize,
}

impl std::ops::Deref for Millis {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.digits[self.start..]
    }
}

impl IdempotencyStore for RedisStore {
    async fn begin(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Result<Begin, StoreError> {
        let claim = Claim::new();
        let previous: Value = redis::cmd("SET")
            .arg(self.key(key))
            .arg(record::encode_in_flight(claim, fingerprint))
            .arg("NX")
            .arg("PX")
            .arg(&*millis(lease))
            .arg("GET")
            .query_async(&mut self.connection.clone())
            .await
            .map_err(StoreError::new)?;
        match previous {
            Value::Nil => Ok(Begin::Started(claim)),
            Value::BulkString(bytes) => record::decode(&bytes)
                .map(Begin::Existing)
                .map_err(StoreError::new),
            other => Err(StoreError::new(format!(
                "unexpected reply to SET NX GET: {}",
                kind(&other)
            ))),
        }
    }

    async fn renew(&self, key: &str, claim: Claim, lease: Duration) -> Result<(), StoreError> {
        self.held(&self.renew, key, claim, &[&millis(lease)]).await
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
        self.held(&self.complete, key, claim, &[&completed, &millis(ttl)])
            .await
    }

    async fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        let value: Option<Vec<u8>> = redis::cmd("GET")
            .arg(self.key(key))
            .query_async(&mut self.connection.clone())
            .await
            .map_err(StoreError::new)?;
        value
            .map(|bytes| record::decode(&bytes).map_err(StoreError::new))
            .transpose()
    }

    async fn release(&self, key: &str, claim: Claim) -> Result<(), StoreError> {
        self.held(&self.release, key, claim, &[]).await
    }
}

/// The reply's kind, never its contents (which may hold a stored response).
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Nil => "nil",
        Value::Int(_) => "an integer",
        Value::BulkString(_) => "a bulk string",
        Value::Array(_) => "an array",
        Value::SimpleString(_) => "a simple string",
        Value::Okay => "OK",
        _ => "another kind",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_are_decimal_at_least_one_at_most_a_century() {
        let text = |d| String::from_utf8(millis(d).to_vec()).unwrap();
        assert_eq!(text(Duration::ZERO), "1");
        assert_eq!(text(Duration::from_micros(10)), "1");
        assert_eq!(text(Duration::from_millis(9)), "9");
        assert_eq!(text(Duration::from_millis(60_000)), "60000");
        assert_eq!(text(Duration::MAX), "3153600000000");
    }
}
