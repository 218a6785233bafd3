//! The store's connections to the current primary: re-established after any error, and
//! re-resolved (through Sentinel, or the address's DNS) when the node they reach no longer
//! takes writes, so a fleet follows a failover instead of talking to a demoted primary.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::SentinelClient;
use redis::{
    AsyncConnectionConfig, ErrorKind, Pipeline, RedisError, RedisResult, ServerErrorKind, Value,
};

/// Where the primary is.
pub(super) enum Source {
    /// One address (a host name that a managed service moves on failover, or a fixed node).
    Fixed(redis::Client),
    /// Asked of Sentinel on every (re)connection.
    Sentinel(tokio::sync::Mutex<SentinelClient>),
    /// A Redis Cluster: redis-rs's cluster connection routes each call by its key's slot,
    /// follows `MOVED`/`ASK` and refreshes its slot map after a failover (`READONLY`).
    Cluster(ClusterConnection),
}

/// One multiplexed connection, made on first use and dropped after an error.
struct Slot {
    /// The connection and the generation it was made in.
    current: Mutex<Option<(u64, MultiplexedConnection)>>,
    /// Held while connecting, so concurrent calls after an error make one connection.
    connecting: tokio::sync::Mutex<()>,
}

/// Connections to the primary. A call that waits for replicas (`WAIT`) blocks the connection it
/// was sent on until the replicas answer, and Redis runs nothing else sent on it meanwhile: so
/// calls that wait are spread over a few connections, and calls that do not (renewals, reads,
/// releases, role checks) have one of their own, the first, which no `WAIT` ever blocks.
pub(super) struct Link {
    source: Source,
    config: AsyncConnectionConfig,
    slots: Box<[Slot]>,
    next: AtomicUsize,
    generation: AtomicU64,
    /// Connections of an older generation than this are not used again: one failed, and those
    /// made before it reach the same node (a failover closes them all, or leaves them on a
    /// demoted primary).
    fresh_from: AtomicU64,
    /// The primary was last seen with fewer replicas than the store waits for (a `WAIT` not
    /// confirmed, or its role): a `WAIT` there would take its whole timeout.
    pub(super) short: AtomicBool,
    /// A cluster's second connection, for the calls that do not wait (redis-rs's cluster
    /// connection has one connection per node, which a `WAIT` blocks).
    cluster_fast: Option<ClusterConnection>,
    /// When every connection was last made to be resolved again (milliseconds from `born`,
    /// plus one; 0: never), to do so at most once per [`RESOLVE_AGAIN`].
    resolved: AtomicU64,
    born: Instant,
}

/// How often a node short of replicas makes the store ask again where the primary is.
const RESOLVE_AGAIN: Duration = Duration::from_secs(1);

impl Link {
    pub(super) fn new(source: Source, config: AsyncConnectionConfig, connections: usize) -> Link {
        let slots = (0..connections.max(1))
            .map(|_| Slot {
                current: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
            })
            .collect();
        Link {
            source,
            config,
            slots,
            next: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            fresh_from: AtomicU64::new(0),
            short: AtomicBool::new(false),
            cluster_fast: None,
            resolved: AtomicU64::new(0),
            born: Instant::now(),
        }
    }

    /// A cluster's link that sends the calls that do not wait on `fast`'s connection (made
    /// apart, with the plain timeout), not on the one `WAIT`s block.
    pub(super) fn with_fast(mut self, fast: Link) -> Link {
        if let Source::Cluster(conn) = fast.source {
            self.cluster_fast = Some(conn);
        }
        self
    }

    /// Whether this is a Redis Cluster's link.
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self.source, Source::Cluster(_))
    }

    /// Every connection is made afresh on its next use, resolved again (through Sentinel, or
    /// the address's DNS): the node answered as a primary with fewer replicas than the store
    /// waits for, as an old primary cut off from the fleet does once a replica was promoted in
    /// its place. At most once per [`RESOLVE_AGAIN`], so that a primary that lost its replicas
    /// costs a connection a second, not one per call. Calls already sent go on. Returns
    /// whether it did.
    pub(super) fn resolve_again(&self) -> bool {
        let now = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1;
        let last = self.resolved.load(Ordering::Relaxed);
        let every = u64::try_from(RESOLVE_AGAIN.as_millis()).unwrap_or(u64::MAX);
        if last != 0 && now < last.saturating_add(every) {
            return false;
        }
        let won = self
            .resolved
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok();
        if won {
            let made = self.generation.load(Ordering::Relaxed);
            self.fresh_from.fetch_max(made, Ordering::Relaxed);
        }
        won
    }

    /// The same primary with another connection config and count (connections made so far are
    /// dropped).
    pub(super) fn with(self, config: AsyncConnectionConfig, connections: usize) -> Link {
        Link::new(self.source, config, connections)
    }

    /// Runs `pipe` on a connection to the primary (one that `WAIT`s may block if `waits`, else
    /// the one they never do). A node that refuses writes (`READONLY`: a
    /// demoted primary) ran nothing, so the call is sent once more on a connection made
    /// afresh, resolved again; any other error drops the connection it came on (the next call
    /// makes a new one) and is returned: it may have been applied.
    pub(super) async fn query(&self, pipe: &Pipeline, waits: bool) -> RedisResult<Vec<Value>> {
        if let Source::Cluster(cluster) = &self.source {
            // Every call's commands touch one key (`WAIT` has none): one slot, one node.
            let conn = match (&self.cluster_fast, waits) {
                (Some(fast), false) => fast,
                _ => cluster,
            };
            return pipe.query_async(&mut conn.clone()).await;
        }
        let slot = match self.slots.len() {
            n if waits && n > 1 => 1 + self.next.fetch_add(1, Ordering::Relaxed) % (n - 1),
            _ => 0,
        };
        let mut again = true;
        loop {
            let (generation, mut conn) = self.connection(slot).await?;
            match pipe.query_async::<Vec<Value>>(&mut conn).await {
                Ok(values) => return Ok(values),
                Err(err) => {
                    if !keeps_connection(&err) {
                        self.drop_connection(slot, generation);
                    }
                    if again && refused_write(&err) {
                        again = false;
                        continue;
                    }
                    return Err(err);
                }
            }
        }
    }

    /// Loads a script on the node that will run it (on every primary of a cluster: the command
    /// alone is routed to all of them).
    pub(super) async fn load_script(&self, code: &str) -> RedisResult<()> {
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(code);
        if let Source::Cluster(cluster) = &self.source {
            return load
                .query_async::<Value>(&mut cluster.clone())
                .await
                .map(drop);
        }
        let mut pipe = redis::pipe();
        pipe.add_command(load);
        self.query(&pipe, false).await.map(drop)
    }

    /// A cluster's topology (`CLUSTER NODES`), to count each primary's replicas.
    pub(super) async fn cluster_nodes(&self) -> Option<RedisResult<String>> {
        let Source::Cluster(cluster) = &self.source else {
            return None;
        };
        Some(
            redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async(&mut cluster.clone())
                .await,
        )
    }

    /// The first connection's role report (`INFO replication`), to check the settings.
    pub(super) async fn info_replication(&self) -> RedisResult<String> {
        let (generation, mut conn) = self.connection(0).await?;
        let info = redis::cmd("INFO")
            .arg("replication")
            .query_async::<String>(&mut conn)
            .await;
        if let Err(err) = &info {
            if !keeps_connection(err) {
                self.drop_connection(0, generation);
            }
        }
        info
    }

    async fn connection(&self, slot: usize) -> RedisResult<(u64, MultiplexedConnection)> {
        let slot_ref = &self.slots[slot];
        if let Some(current) = self.current(slot_ref) {
            return Ok(current);
        }
        let _connecting = slot_ref.connecting.lock().await;
        if let Some(current) = self.current(slot_ref) {
            return Ok(current);
        }
        let client = match &self.source {
            Source::Fixed(client) => client.clone(),
            Source::Sentinel(sentinel) => sentinel.lock().await.async_get_client().await?,
            Source::Cluster(_) => {
                return Err(RedisError::from((
                    ErrorKind::Client,
                    "a cluster is reached through its own connection",
                )))
            }
        };
        let conn = client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut current) = slot_ref.current.lock() {
            *current = Some((generation, conn.clone()));
        }
        Ok((generation, conn))
    }

    /// Drops the connection `generation` of `slot`, and every connection made before it: they
    /// reach the same node (a failover closes them all, or leaves them on a demoted primary).
    fn drop_connection(&self, slot: usize, generation: u64) {
        self.fresh_from.fetch_max(generation + 1, Ordering::Relaxed);
        if let Ok(mut current) = self.slots[slot].current.lock() {
            if current.as_ref().is_some_and(|(g, _)| *g == generation) {
                *current = None;
            }
        }
    }

    /// The slot's connection, unless it is of a generation no longer used.
    fn current(&self, slot: &Slot) -> Option<(u64, MultiplexedConnection)> {
        let fresh_from = self.fresh_from.load(Ordering::Relaxed);
        let mut current = slot.current.lock().ok()?;
        if current.as_ref().is_some_and(|(g, _)| *g < fresh_from) {
            *current = None;
        }
        current.clone()
    }
}

/// A node that takes no writes now: a demoted primary (`READONLY`), or a replica that lost its
/// primary and refuses (`MASTERDOWN`). Neither ran the call.
pub(super) fn refused_write(err: &RedisError) -> bool {
    matches!(
        err.kind(),
        ErrorKind::Server(ServerErrorKind::ReadOnly)
            | ErrorKind::Server(ServerErrorKind::MasterDown)
    )
}

/// Errors that say nothing about the connection: a script not loaded yet on this node.
fn keeps_connection(err: &RedisError) -> bool {
    matches!(err.kind(), ErrorKind::Server(ServerErrorKind::NoScript))
}
