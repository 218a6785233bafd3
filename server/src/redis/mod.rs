//! `RedisStore`: idempotency keys shared by a fleet of servers through Redis.

mod builder;
mod link;
mod replicas;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::{Script, Value};

pub use builder::RedisStoreBuilder;
use link::Link;

use crate::encoding;
use crate::store::{
    Begin, Entry, FencingToken, Fingerprint, IdempotencyStore, StoreError, StoredResponse,
};

/// Compare-and-set on the claim, then act: every script reads and writes one key only, so it
/// runs unchanged on Redis Cluster and Valkey. `ARGV[1]` is the claim's in-flight entry prefix
/// (version, kind, token: `encoding::HOLDER_LEN` bytes), compared at its own length, so the
/// scripts hold no copy of the entry format.
///
/// `COMPLETE` writes the completed entry (`ARGV[2]`) if the key holds the claim, or the entry
/// this claim completed already (a completion sent again after its replicas did not confirm
/// it: on a new primary after a failover the key may hold the claim again), or nothing (the
/// claim's lease ran out and no one claimed the key since: the outcome is kept, not lost).
const COMPLETE: &str = r"
local v = redis.call('GET', KEYS[1])
if v then
  local head = string.sub(v, 1, #ARGV[1])
  if head ~= ARGV[1] and head ~= string.sub(ARGV[2], 1, #ARGV[1]) then return 0 end
end
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
/// - A claim is `SET key entry NX PX lease GET`: one atomic command that claims a free key
///   and returns what a taken one holds. The claim's lease is its expiry, renewed while the
///   handler runs; a crashed server's claim ends with its lease.
/// - `complete`, `renew` and `release` are Lua scripts that compare the entry's fencing
///   token before they write, so a server whose claim was taken over changes nothing. Each
///   script touches one key: it runs unchanged on Redis Cluster.
/// - Entries use a compact, versioned binary encoding (`src/encoding.rs` in this package). An entry
///   of a version this server does not read is an error: the layer answers 503 and logs it,
///   never misreads it.
/// - **Replicas.** Redis replicates asynchronously: a write its primary acknowledged can be
///   lost in a failover. So a claim and a stored response count as written only once
///   [as many replicas as asked](RedisStoreBuilder::wait_for_replicas) have it (`WAIT`, sent in
///   the same round trip as the write). A claim the replicas do not confirm in time is released
///   and the request answered 503 with `Retry-After`, its handler not run; a stored response
///   they do not confirm (written on the primary, where repeats find it) is sent again in the
///   background, the key held, until they do. By default the store waits for one replica when
///   the primary has one or more at connect, and for none on a Redis without replicas.
/// - **Renewals** are not waited for: confirming one would change nothing (the handler runs on
///   either way). Each is sent with the script's text (`EVAL`: no node lacks it), on a
///   connection of its own that no `WAIT` blocks, so it lands within a round trip whatever the
///   replicas do; the primary's role (`ROLE`) is read beside it. A renewal that fails is sent
///   again every 1/48 of the lease. So replicas keep a claim's expiry as the last write they
///   received set it: one that stays connected but receives nothing for longer than the lease
///   reads the key as free, and promoted then, it runs a repeat of a key whose handler still
///   runs (see the crate docs' "A replica that receives nothing": a lease longer than
///   the longest handler plus a failover narrows it; `min-replicas-max-lag` does not).
/// - **Replicas gone or stalled.** While the primary has fewer replicas connected than the
///   store waits for (a `WAIT` not confirmed, or its role, says so), nothing waits for them: a
///   claim is refused at once (503, nothing written), a stored response is written without
///   waiting and sent again until replicas confirm it, and the role is read before each such
///   call until they are back. A replica that stays connected but stalls delays claims and
///   stored responses by the [replica timeout](RedisStoreBuilder::replica_timeout), never
///   renewals.
/// - **Failover.** A connection is made again after any error, and re-resolved: through
///   [Sentinel](RedisStore::sentinel), or the address (a managed service's name that follows
///   the promotion). A node that answers a write with `READONLY` (a demoted primary) ran
///   nothing: the call is sent once more on a fresh connection, and if that node still refuses,
///   the layer answers 503 — never a fresh claim. A primary short of the replicas waited for may
///   be an old primary cut off from Sentinel but not from this server (its replica promoted,
///   itself never demoted): every connection is then made afresh (at most once a second) and
///   resolved again, so renewals and stored responses follow Sentinel to the new primary. A
///   claim's owner renews and completes it on the new primary, and fencing holds there: a stale
///   owner never overwrites a newer entry. Reading the role needs `ROLE` (checked at connect);
///   a user denied it gets renewals without it, and only a `WAIT` not confirmed finds a primary
///   short of replicas.
/// - **Cluster.** [`RedisStore::cluster`] runs the same calls on a Redis Cluster: a key is one
///   Redis key, so its claim, entry and fencing live in one hash slot. Renewals go on a
///   cluster connection apart from the one `WAIT`s block; the role is not read (each shard has
///   its own primary), so a shard short of replicas is found by its `WAIT`s alone.
/// - Keys are only as durable as Redis keeps them: run it with `maxmemory-policy noeviction`
///   (the [crate docs](crate#what-each-topology-guarantees) say what each topology guarantees).
/// - While Redis is unreachable every call fails fast (a 1 s connection and response timeout
///   by default) and the layer answers 503 with `Retry-After`, running nothing; service
///   resumes when Redis is back, without a restart. A claim is kept through an outage that
///   ends before the lease its last renewal set does: any outage shorter than two thirds of
///   the lease, wherever it falls (renewals are at most a third of a lease apart); never one
///   longer than the lease.
///
/// ```no_run
/// use tower_idempotency_keys::{stores::RedisStore, IdempotencyLayer};
///
/// # async fn demo() -> Result<(), tower_idempotency_keys::StoreError> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379").await?.prefix("myapp:idem:");
/// let layer = IdempotencyLayer::new(store);
/// # drop(layer);
/// // Through Sentinel, waiting for two replicas:
/// let store = RedisStore::sentinel(["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"], "idem")
///     .wait_for_replicas(2)
///     .connect()
///     .await?;
/// # drop(store);
/// # Ok(()) }
/// ```
///
/// # Clone
///
/// Clones share the connections.
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[derive(Clone)]
pub struct RedisStore {
    link: Arc<Link>,
    prefix: String,
    /// Replicas to wait for (0: no `WAIT`) and how long, in milliseconds.
    replicas: u32,
    replica_timeout_ms: u64,
    /// Whether the primary's role (`ROLE`) is read beside renewals, and before a write while it
    /// was last seen short of replicas: the store waits for some, the user may run `ROLE`, and
    /// there is one primary (a cluster has one per shard).
    role: bool,
    complete: Script,
    release: Script,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("wait_for_replicas", &self.replicas)
            .field("replica_timeout_ms", &self.replica_timeout_ms)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to the Redis at `url` (`redis://host:port/db`, `rediss://` for TLS if redis-rs
    /// was built with TLS) with the [builder](RedisStoreBuilder)'s defaults: a 1 s connection
    /// and response timeout, the key prefix `idempotency:`, and one replica waited for when
    /// the primary has any. Fails if the URL is invalid or Redis does not answer.
    pub async fn connect(url: &str) -> Result<RedisStore, StoreError> {
        RedisStore::builder(url).connect().await
    }

    /// [`connect`](Self::connect) with another connection and response timeout: how long a
    /// call may wait for Redis before the layer answers 503.
    pub async fn connect_with(url: &str, timeout: Duration) -> Result<RedisStore, StoreError> {
        RedisStore::builder(url).timeout(timeout).connect().await
    }

    /// A store at `url`, with settings to choose before [connecting](RedisStoreBuilder::connect).
    pub fn builder(url: &str) -> RedisStoreBuilder {
        RedisStoreBuilder::fixed(url)
    }

    /// A store on the Redis Cluster whose nodes (some of them: the rest are discovered) are at
    /// `nodes` (`redis://host:port`). Each key is one Redis key, so its claim, entry and
    /// fencing live in one hash slot, and every script touches only it; redis-rs's cluster
    /// connection routes each call to the slot's primary, follows `MOVED` and `ASK`, and
    /// refreshes its slot map after a failover. Waiting for replicas counts the replicas of the
    /// key's own primary.
    pub fn cluster<I, U>(nodes: I) -> RedisStoreBuilder
    where
        I: IntoIterator<Item = U>,
        U: AsRef<str>,
    {
        RedisStoreBuilder::cluster(nodes)
    }

    /// A store on the primary that the Sentinels at `sentinels` (`redis://host:26379`) name
    /// for the master `master`, asked again whenever a connection is made, so that the store
    /// follows a failover.
    pub fn sentinel<I, U>(sentinels: I, master: &str) -> RedisStoreBuilder
    where
        I: IntoIterator<Item = U>,
        U: AsRef<str>,
    {
        RedisStoreBuilder::sentinel(sentinels, master)
    }

    /// The prefix of every Redis key this store writes.
    ///
    /// Defaults to `idempotency:`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How many replicas a write waits for (0: none), as set or found at connect.
    pub fn replicas_waited_for(&self) -> u32 {
        self.replicas
    }

    fn key(&self, key: &str) -> String {
        // Not `format!`: its machinery costs more than the copy, on every call.
        let mut out = String::with_capacity(self.prefix.len() + key.len());
        out.push_str(&self.prefix);
        out.push_str(key);
        out
    }

    /// Runs a compare-and-set script (and `WAIT` if `wait`); `Ok(())` if the claim held the key
    /// (and the replicas confirmed the write).
    async fn held(
        &self,
        script: &Script,
        key: &str,
        token: FencingToken,
        arg: &[&[u8]],
        wait: bool,
    ) -> Result<(), StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("EVALSHA")
            .arg(script.get_hash())
            .arg(1)
            .arg(self.key(key))
            .arg(&encoding::in_flight_holder(token)[..]);
        for a in arg {
            pipe.arg(*a);
        }
        if wait {
            self.wait(&mut pipe);
        }
        let waits = wait && self.replicas > 0;
        let replies = match self.link.query(&pipe, waits).await {
            Ok(replies) => replies,
            Err(err)
                if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                // Not loaded on this node (a new primary, a restart): nothing ran. Load it
                // and send the call again.
                self.link
                    .load_script(script_code(script, self))
                    .await
                    .map_err(StoreError::new)?;
                self.link
                    .query(&pipe, waits)
                    .await
                    .map_err(StoreError::new)?
            }
            Err(err) => return Err(StoreError::new(err)),
        };
        script_reply(replies.first())?;
        if wait && !self.confirmed(&replies)? {
            return Err(self.not_confirmed("write"));
        }
        Ok(())
    }
}

/// The source of one of the store's scripts.
fn script_code(script: &Script, store: &RedisStore) -> &'static str {
    if script.get_hash() == store.complete.get_hash() {
        COMPLETE
    } else {
        RELEASE
    }
}

/// `Ok(())` if a compare-and-set script acted (the claim held the key), else fenced.
fn script_reply(reply: Option<&Value>) -> Result<(), StoreError> {
    match reply {
        Some(Value::Int(1)) => Ok(()),
        Some(Value::Int(_)) => Err(StoreError::fenced()),
        Some(other) => Err(unexpected("a script", other)),
        None => Err(StoreError::new("no reply to a script")),
    }
}

fn unexpected(what: &str, value: &Value) -> StoreError {
    StoreError::new(format!("unexpected reply to {what}: {}", kind(value)))
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
        if !self.enough_replicas().await? {
            // Nothing written: the handler does not run, and the request gets 503.
            return Err(self.short_of_replicas("claim"));
        }
        let token = FencingToken::new();
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(self.key(key))
            .arg(encoding::encode_in_flight(token, fingerprint))
            .arg("NX")
            .arg("PX")
            .arg(&*millis(lease))
            .arg("GET");
        self.wait(&mut pipe);
        let replies = self
            .link
            .query(&pipe, self.replicas > 0)
            .await
            .map_err(StoreError::new)?;
        match replies.first() {
            Some(Value::Nil) => {
                if self.confirmed(&replies)? {
                    return Ok(Begin::Started(token));
                }
                // Written, not confirmed: a failover now could lose it. The handler has not
                // run, so the claim is withdrawn (if it still holds the key) and the request
                // refused; a release that fails leaves the claim to its lease.
                let _ = self.held(&self.release, key, token, &[], false).await;
                Err(self.not_confirmed("claim"))
            }
            Some(Value::BulkString(bytes)) => encoding::decode(bytes)
                .map(Begin::Existing)
                .map_err(StoreError::new),
            Some(other) => Err(unexpected("SET NX GET", other)),
            None => Err(StoreError::new("no reply to SET NX GET")),
        }
    }

    /// Sent with `EVAL` (the script's text), so no node ever lacks it (`NOSCRIPT`), and not
    /// waited for: on the connection that no `WAIT` blocks, it lands within a round trip
    /// whatever the replicas do. Confirming it would change nothing (the handler runs on
    /// either way); the primary's role read beside it tells the store when the node has lost
    /// its replicas. It may then be an old primary cut off from the fleet, whose replica was
    /// promoted: the renewal is sent once more, to the primary named now.
    async fn renew(
        &self,
        key: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("EVAL")
            .arg(RENEW)
            .arg(1)
            .arg(self.key(key))
            .arg(&encoding::in_flight_holder(token)[..])
            .arg(&*millis(lease));
        if self.role {
            pipe.cmd("ROLE");
        }
        for _ in 0..2 {
            let replies = self
                .link
                .query(&pipe, false)
                .await
                .map_err(StoreError::new)?;
            script_reply(replies.first())?;
            if !self.role || !self.note_role(replies.get(1)).1 {
                break;
            }
        }
        Ok(())
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
        // Short of replicas, the entry is written without waiting (repeats find it on this
        // primary) and reported not confirmed: the layer keeps sending it until it is.
        let wait = self.enough_replicas().await?;
        let args: [&[u8]; 2] = [&completed, &millis(ttl)];
        self.held(&self.complete, key, token, &args, wait).await?;
        if !wait {
            return Err(self.short_of_replicas("stored response"));
        }
        Ok(())
    }

    async fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg(self.key(key));
        let replies = self
            .link
            .query(&pipe, false)
            .await
            .map_err(StoreError::new)?;
        match replies.first() {
            Some(Value::Nil) => Ok(None),
            Some(Value::BulkString(bytes)) => {
                encoding::decode(bytes).map(Some).map_err(StoreError::new)
            }
            Some(other) => Err(unexpected("GET", other)),
            None => Err(StoreError::new("no reply to GET")),
        }
    }

    async fn release(&self, key: &str, token: FencingToken) -> Result<(), StoreError> {
        // Not waited for: a release lost in a failover leaves the claim to its lease (repeats
        // get 409 meanwhile), never a second run.
        self.held(&self.release, key, token, &[], false).await
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
