//! `RedisStoreBuilder`: where the primary is, how long to wait for it, and how many replicas
//! a write waits for; checked against the primary at connect.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{AsyncConnectionConfig, Script};

use super::link::{Link, Source};
use super::{RedisStore, COMPLETE, RELEASE};
use crate::store::StoreError;

/// Connections used when writes wait for replicas: a `WAIT` holds its connection until the
/// replicas answer, so concurrent calls are spread over several.
const WAITING_CONNECTIONS: usize = 4;

enum Target {
    Fixed(String),
    Sentinel {
        sentinels: Vec<String>,
        master: String,
    },
    Cluster(Vec<String>),
}

/// Settings of a [`RedisStore`], checked when it [connects](Self::connect). From
/// [`RedisStore::builder`] (one address) or [`RedisStore::sentinel`].
///
/// Its `Debug` shows no address: a URL may hold a password.
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub struct RedisStoreBuilder {
    target: Target,
    timeout: Duration,
    replicas: Option<u32>,
    replica_timeout: Duration,
    prefix: String,
    /// The user name and password of the primary reached through Sentinel. Never shown.
    primary_auth: Option<(Option<String>, String)>,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let through = match self.target {
            Target::Fixed(_) => "one address",
            Target::Sentinel { .. } => "Sentinel",
            Target::Cluster(_) => "Redis Cluster",
        };
        f.debug_struct("RedisStoreBuilder")
            .field("through", &through)
            .field("timeout", &self.timeout)
            .field("wait_for_replicas", &self.replicas)
            .field("replica_timeout", &self.replica_timeout)
            .field("prefix", &self.prefix)
            .field("primary_auth", &self.primary_auth.as_ref().map(|_| "…"))
            .finish()
    }
}

impl RedisStoreBuilder {
    fn new(target: Target) -> Self {
        RedisStoreBuilder {
            target,
            timeout: Duration::from_secs(1),
            replicas: None,
            replica_timeout: Duration::from_millis(500),
            prefix: "idempotency:".to_owned(),
            primary_auth: None,
        }
    }

    pub(super) fn fixed(url: &str) -> Self {
        Self::new(Target::Fixed(url.to_owned()))
    }

    pub(super) fn sentinel<I, U>(sentinels: I, master: &str) -> Self
    where
        I: IntoIterator<Item = U>,
        U: AsRef<str>,
    {
        Self::new(Target::Sentinel {
            sentinels: sentinels
                .into_iter()
                .map(|u| u.as_ref().to_owned())
                .collect(),
            master: master.to_owned(),
        })
    }

    pub(super) fn cluster<I, U>(nodes: I) -> Self
    where
        I: IntoIterator<Item = U>,
        U: AsRef<str>,
    {
        Self::new(Target::Cluster(
            nodes.into_iter().map(|u| u.as_ref().to_owned()).collect(),
        ))
    }

    /// How long connecting to Redis, and a call's answer, may take before the call fails and
    /// the layer answers 503 (a call that waits for replicas has
    /// [`replica_timeout`](Self::replica_timeout) more).
    ///
    /// Defaults to 1 s.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How many replicas must have a claim or a stored response before it counts as written
    /// (`WAIT n`): a write only the primary has is lost if a replica that lacks it is
    /// promoted, and the key's handler could then run again. `0` waits for none. Renewals are
    /// never waited for (see [`RedisStore`]).
    ///
    /// Waiting for one replica protects against a failover that promotes the most up-to-date
    /// replica (Sentinel's and managed services' choice among replicas of equal priority);
    /// waiting for every replica protects whichever is promoted, and refuses keyed requests
    /// (503) while any one is down.
    ///
    /// Defaults to 1 if the primary has at least one replica connected at connect, else 0:
    /// a single Redis keeps working unchanged, and a primary with a replica (a managed
    /// service's usual pair) loses no key in a failover. [`connect`](Self::connect) fails if
    /// the primary has fewer replicas connected than set here.
    pub fn wait_for_replicas(mut self, replicas: u32) -> Self {
        self.replicas = Some(replicas);
        self
    }

    /// How long a write waits for its replicas. A claim not confirmed in time is withdrawn and
    /// the request answered 503 (its handler not run); a stored response not confirmed in
    /// time is sent again while the key is held. While the primary has fewer replicas connected
    /// than waited for, nothing waits this long (see [`RedisStore`]).
    ///
    /// Defaults to 500 ms. Must be above zero (`WAIT` with 0 waits forever).
    pub fn replica_timeout(mut self, timeout: Duration) -> Self {
        self.replica_timeout = timeout;
        self
    }

    /// The prefix of every Redis key the store writes.
    ///
    /// Defaults to `idempotency:`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Through Sentinel: the user name (`None`: the default user) and password of the primary
    /// (and of whichever replica is promoted) that Sentinel names. A Sentinel's own password
    /// goes in its URL (`redis://:password@host:26379`). Ignored for a store on one address or
    /// a cluster, whose URLs carry their credentials.
    ///
    /// Defaults to none. Neither is ever shown in an error or in `Debug`.
    pub fn primary_auth(mut self, username: Option<&str>, password: &str) -> Self {
        self.primary_auth = Some((username.map(str::to_owned), password.to_owned()));
        self
    }

    /// Connects, reads the primary's replication state (`INFO replication`; a cluster's
    /// `CLUSTER NODES`, counting the replicas of the primary that has the fewest), and checks
    /// the settings against it. Fails if an address is invalid, Redis (or every Sentinel) does not
    /// answer, the node is not a primary, or the settings cannot be met: the error names the
    /// setting.
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
        if self.replica_timeout.is_zero() {
            return Err(StoreError::new(
                "RedisStoreBuilder::replica_timeout(0): must be above zero (WAIT 0 waits forever)",
            ));
        }
        let replica_ms = u64::try_from(self.replica_timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let waited = self.timeout.saturating_add(self.replica_timeout);
        // The role check runs on a link of one connection with the plain timeout.
        let probe = Link::new(self.source(self.timeout).await?, config(self.timeout), 1);
        let (primary, connected) = match probe.cluster_nodes().await {
            Some(nodes) => (true, fewest_replicas(&nodes.map_err(StoreError::new)?)),
            None => match probe.info_replication().await {
                Ok(info) => replication(&info),
                // A service that denies `INFO` (an ACL): an explicit setting is taken as it is.
                Err(err)
                    if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) =>
                {
                    match self.replicas {
                        Some(n) => (true, n),
                        None => {
                            return Err(StoreError::new(
                                "the Redis user may not run INFO, so the replicas to wait for cannot be found: set RedisStoreBuilder::wait_for_replicas",
                            ))
                        }
                    }
                }
                Err(err) => return Err(StoreError::new(err)),
            },
        };
        if !primary {
            return Err(StoreError::new(
                "the Redis node is a replica, not a primary: connect to the primary (or through Sentinel)",
            ));
        }
        let replicas = match self.replicas {
            Some(n) if n > connected => {
                return Err(StoreError::new(format!(
                    "RedisStoreBuilder::wait_for_replicas({n}): the primary has {connected} replica(s) connected"
                )));
            }
            Some(n) => n,
            None => connected.min(1),
        };
        let role = replicas > 0 && !probe.is_cluster() && role_allowed(&probe).await?;
        let link = match (replicas, &self.target) {
            (0, _) => probe,
            // The cluster connection's timeouts are its own: made again with room for `WAIT`.
            // The first stays, for calls that do not wait.
            (_, Target::Cluster(_)) => {
                Link::new(self.source(waited).await?, config(waited), 1).with_fast(probe)
            }
            // And one more that no `WAIT` blocks.
            _ => probe.with(config(waited), WAITING_CONNECTIONS + 1),
        };
        Ok(RedisStore {
            link: Arc::new(link),
            prefix: self.prefix,
            replicas,
            replica_timeout_ms: replica_ms,
            role,
            complete: Script::new(COMPLETE),
            release: Script::new(RELEASE),
        })
    }
}

impl RedisStoreBuilder {
    /// Where the primary is; a cluster's connection, made with `timeout`.
    async fn source(&self, timeout: Duration) -> Result<Source, StoreError> {
        Ok(match &self.target {
            Target::Fixed(url) => {
                Source::Fixed(redis::Client::open(url.as_str()).map_err(|e| {
                    StoreError::new(format!("the Redis URL is invalid: {}", e.category()))
                })?)
            }
            Target::Sentinel { sentinels, master } => {
                if sentinels.is_empty() {
                    return Err(StoreError::new(
                        "RedisStore::sentinel: no Sentinel address was given",
                    ));
                }
                let node = self.primary_auth.as_ref().map(|(username, password)| {
                    let mut auth = redis::RedisConnectionInfo::default().set_password(password);
                    if let Some(username) = username {
                        auth = auth.set_username(username);
                    }
                    SentinelNodeConnectionInfo::default().set_redis_connection_info(auth)
                });
                let client = SentinelClient::build(
                    sentinels.iter().map(String::as_str).collect(),
                    master.clone(),
                    node,
                    SentinelServerType::Master,
                )
                .map_err(|e| {
                    StoreError::new(format!("a Sentinel URL is invalid: {}", e.category()))
                })?;
                Source::Sentinel(tokio::sync::Mutex::new(client))
            }
            Target::Cluster(nodes) => {
                if nodes.is_empty() {
                    return Err(StoreError::new(
                        "RedisStore::cluster: no node address was given",
                    ));
                }
                let client =
                    redis::cluster::ClusterClient::builder(nodes.iter().map(String::as_str))
                        .connection_timeout(timeout)
                        .response_timeout(timeout)
                        .build()
                        .map_err(|e| {
                            StoreError::new(format!(
                                "a cluster node URL is invalid: {}",
                                e.category()
                            ))
                        })?;
                Source::Cluster(
                    client
                        .get_async_connection()
                        .await
                        .map_err(StoreError::new)?,
                )
            }
        })
    }
}

/// Whether the user may run `ROLE` (read beside renewals to find a primary that lost its
/// replicas): a service whose ACL denies it gets renewals without it.
async fn role_allowed(probe: &Link) -> Result<bool, StoreError> {
    let mut pipe = redis::pipe();
    pipe.cmd("ROLE");
    match probe.query(&pipe, false).await {
        Ok(_) => Ok(true),
        Err(err) if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) => {
            Ok(false)
        }
        Err(err) => Err(StoreError::new(err)),
    }
}

/// The fewest replicas (not failed) of any primary that serves slots, in `CLUSTER NODES`.
fn fewest_replicas(nodes: &str) -> u32 {
    let lines: Vec<Vec<&str>> = nodes
        .lines()
        .map(|l| l.split_whitespace().collect())
        .filter(|f: &Vec<&str>| f.len() >= 8)
        .collect();
    lines
        .iter()
        .filter(|f| f[2].contains("master") && !f[2].contains("fail") && f.len() > 8)
        .map(|primary| {
            lines
                .iter()
                .filter(|f| f[2].contains("slave") && !f[2].contains("fail") && f[3] == primary[0])
                .count() as u32
        })
        .min()
        .unwrap_or(0)
}

fn config(timeout: Duration) -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
}

/// Whether `INFO replication` says primary (`role:master`), and its connected replicas.
fn replication(info: &str) -> (bool, u32) {
    let mut primary = false;
    let mut connected = 0;
    for line in info.lines() {
        let line = line.trim_end();
        if let Some(role) = line.strip_prefix("role:") {
            primary = role == "master";
        } else if let Some(n) = line.strip_prefix("connected_slaves:") {
            connected = n.parse().unwrap_or(0);
        }
    }
    (primary, connected)
}

#[cfg(test)]
mod tests {
    use super::replication;

    #[test]
    fn replication_info_is_read_for_role_and_replicas() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\nslave0:ip=127.0.0.1\r\n";
        assert_eq!(replication(info), (true, 2));
        assert_eq!(replication("role:slave\r\nmaster_host:x\r\n"), (false, 0));
        assert_eq!(replication(""), (false, 0));
    }

    #[test]
    fn cluster_nodes_are_read_for_the_fewest_replicas_of_a_primary() {
        let nodes = "a 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n\
                     b 127.0.0.1:7001@17001 master - 0 0 2 connected 5461-10922\n\
                     c 127.0.0.1:7003@17003 slave a 0 0 1 connected\n\
                     d 127.0.0.1:7004@17004 slave b 0 0 2 connected\n\
                     e 127.0.0.1:7005@17005 slave,fail b 0 0 2 connected\n";
        assert_eq!(super::fewest_replicas(nodes), 1);
        let no_replicas = "a 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-16383\n";
        assert_eq!(super::fewest_replicas(no_replicas), 0);
    }
}
