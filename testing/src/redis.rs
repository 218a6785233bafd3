//! The Redis a test uses, found the same way on every machine:
//!
//! 1. `REDIS_URL`, when set (it must answer);
//! 2. else the default local address, `redis://127.0.0.1:6379`, when it answers;
//! 3. else a `redis-server` of the test's own on a free port, when the binary is on `PATH`
//!    (stopped when the test ends);
//! 4. else the test fails with one line that says what to install.
//!
//! Every test writes under a prefix of its own and deletes its keys when it ends: a run
//! leaves nothing behind.
#![allow(dead_code)]

use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::fleet::OwnRedis;

/// The store's timeouts (a call's round trip, and `WAIT` for a replica) where a scenario
/// needs its calls to succeed and does not test the timeouts themselves. A call on a fresh
/// connection resolves the primary through Sentinel, connects, authenticates and waits for a
/// replica: in a CI run beside a build on two cores, a first `begin` did not get through
/// within the defaults (1 s and 500 ms), and a test about a password failed on it.
pub const PATIENT: Duration = Duration::from_secs(10);

const LOCAL: &str = "redis://127.0.0.1:6379";

/// What to do when no Redis can be found or started, in one line.
pub const INSTALL: &str = "these tests need Redis: set REDIS_URL, run redis-server on \
127.0.0.1:6379, or install redis-server (e.g. `apt-get install redis-server`) so they start \
their own";

pub struct TestRedis {
    url: String,
    prefix: String,
    own: Option<OwnRedis>,
}

impl TestRedis {
    /// The Redis for the test named `test`, and a key prefix no other test or run uses.
    pub fn start(test: &str) -> TestRedis {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let prefix = format!("trs-test:{test}:{}-{nanos}:", std::process::id());
        if let Ok(url) = std::env::var("REDIS_URL") {
            assert!(
                answers(&url),
                "REDIS_URL is set but does not answer PING; {INSTALL}"
            );
            return TestRedis {
                url,
                prefix,
                own: None,
            };
        }
        if answers(LOCAL) {
            return TestRedis {
                url: LOCAL.to_owned(),
                prefix,
                own: None,
            };
        }
        let installed = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(installed, "{INSTALL}");
        let own = OwnRedis::start();
        TestRedis {
            url: own.url(),
            prefix,
            own: Some(own),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The test's own key prefix: pass it to `RedisStore::prefix` (or extend it).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Keys under the test's prefix now (for tests that check they leave none).
    pub fn keys(&self) -> usize {
        count_keys(&self.url, &self.prefix)
    }

    /// Whether this is a `redis-server` of the test's own (it goes when the test ends).
    pub fn is_own(&self) -> bool {
        self.own.is_some()
    }
}

/// Keys that start with `prefix` on the Redis at `url` (0 when it does not answer).
pub fn count_keys(url: &str, prefix: &str) -> usize {
    let Ok(mut conn) = connection(url) else {
        return 0;
    };
    scan(&mut conn, prefix).len()
}

impl Drop for TestRedis {
    /// Deletes every key under the test's prefix (a server of the test's own goes with it).
    fn drop(&mut self) {
        if self.own.is_some() {
            return;
        }
        let Ok(mut conn) = connection(&self.url) else {
            return;
        };
        for key in scan(&mut conn, &self.prefix) {
            let _: redis::RedisResult<()> = redis::cmd("DEL").arg(&key).query(&mut conn);
        }
    }
}

fn connection(url: &str) -> redis::RedisResult<redis::Connection> {
    redis::Client::open(url)?.get_connection_with_timeout(Duration::from_millis(500))
}

fn answers(url: &str) -> bool {
    connection(url)
        .and_then(|mut conn| redis::cmd("PING").query::<String>(&mut conn))
        .is_ok()
}

/// Every key that starts with `prefix`.
fn scan(conn: &mut redis::Connection, prefix: &str) -> Vec<String> {
    // The prefix is ours (letters, digits, `-`, `:`): no glob characters to escape.
    let pattern = format!("{prefix}*");
    let mut keys = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let step: redis::RedisResult<(u64, Vec<String>)> = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query(conn);
        let Ok((next, batch)) = step else {
            return keys;
        };
        keys.extend(batch);
        if next == 0 {
            return keys;
        }
        cursor = next;
    }
}

/// A free port on loopback (bound, then let go: the server that takes it binds it next).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Polls `done` every 20 ms until it holds, for at most `limit`; panics with `what` after.
/// Scenarios wait on states, never on a guess of how long something takes.
pub fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// [`wait_until`] for async conditions.
pub async fn wait_until_async<F, Fut>(what: &str, limit: Duration, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = std::time::Instant::now();
    while !done().await {
        assert!(start.elapsed() < limit, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A `redis-server` process of the test's own (a node, or a Sentinel), killed by its pid when
/// dropped, also when the test fails.
pub struct Node {
    pub port: u16,
    child: Option<std::process::Child>,
    /// A Sentinel's config file (Sentinel rewrites it), removed on drop.
    config: Option<std::path::PathBuf>,
    /// The password the node requires, if any (`url` carries it).
    password: Option<String>,
}

impl Node {
    /// A primary on a free port, without persistence.
    pub fn primary() -> Node {
        Node::spawn(free_port(), &[], None)
    }

    /// A node for a Redis Cluster (`cluster-enabled yes`), its nodes file in the temp dir.
    pub fn cluster_node() -> Node {
        let port = free_port();
        let nodes_file = std::env::temp_dir().join(format!("trs-nodes-{port}.conf"));
        let nodes_file = nodes_file.display().to_string();
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            nodes_file.as_str(),
            "--cluster-node-timeout",
            "2000",
        ];
        Node::spawn(port, &args, None)
    }

    /// A primary that requires `password` (and its replicas' primary link too).
    pub fn primary_with_password(password: &str) -> Node {
        let args = ["--requirepass", password, "--masterauth", password];
        Node::spawn_with_password(free_port(), &args, password)
    }

    /// A replica of the node on `upstream_port`, both requiring `password`.
    pub fn replica_with_password(upstream_port: u16, password: &str) -> Node {
        let upstream = upstream_port.to_string();
        let args = [
            "--replicaof",
            "127.0.0.1",
            upstream.as_str(),
            "--requirepass",
            password,
            "--masterauth",
            password,
        ];
        Node::spawn_with_password(free_port(), &args, password)
    }

    fn spawn_with_password(port: u16, args: &[&str], password: &str) -> Node {
        let mut command = Command::new("redis-server");
        command.args(["--port", &port.to_string(), "--bind", "127.0.0.1"]);
        command.args(["--save", "", "--appendonly", "no"]);
        command.arg("--dir").arg(std::env::temp_dir());
        command.args(["--dbfilename", &format!("trs-test-{port}.rdb")]);
        command.args(args);
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{INSTALL}: {e}"));
        let node = Node {
            port,
            child: Some(child),
            config: None,
            password: Some(password.to_owned()),
        };
        wait_until("redis-server to listen", Duration::from_secs(20), || {
            node.query::<String>(&redis::cmd("PING")).is_ok()
        });
        node
    }

    /// A replica of the node (or proxy) on `upstream_port`.
    pub fn replica_of(upstream_port: u16) -> Node {
        Node::spawn(
            free_port(),
            &["--replicaof", "127.0.0.1", &upstream_port.to_string()],
            None,
        )
    }

    /// A Sentinel on a free port that watches the primary on `primary_port` as `master`,
    /// alone (quorum 1), quick to act (down after 1 s).
    pub fn sentinel(master: &str, primary_port: u16) -> Node {
        Node::sentinel_with(master, primary_port, "")
    }

    /// [`Node::sentinel`] with more lines of config (`sentinel auth-pass …`).
    pub fn sentinel_with(master: &str, primary_port: u16, more: &str) -> Node {
        let port = free_port();
        let path =
            std::env::temp_dir().join(format!("trs-sentinel-{}-{port}.conf", std::process::id()));
        let config = format!(
            "port {port}\nbind 127.0.0.1\ndir {dir}\n\
             sentinel monitor {master} 127.0.0.1 {primary_port} 1\n\
             sentinel down-after-milliseconds {master} 1000\n\
             sentinel failover-timeout {master} 2000\n\
             sentinel parallel-syncs {master} 5\n{more}",
            dir = std::env::temp_dir().display()
        );
        std::fs::write(&path, config).expect("write the Sentinel config");
        let path_arg = path.display().to_string();
        Node::spawn(port, &[path_arg.as_str(), "--sentinel"], Some(path))
    }

    fn spawn(port: u16, args: &[&str], config: Option<std::path::PathBuf>) -> Node {
        let mut command = Command::new("redis-server");
        // A config file comes first; the other options after it.
        let (first, rest) = match config {
            Some(_) => (args.first().copied(), &args[1..]),
            None => (None, args),
        };
        command.args(first);
        if config.is_none() {
            command.args(["--port", &port.to_string(), "--bind", "127.0.0.1"]);
            command.args(["--save", "", "--appendonly", "no"]);
            // A replica keeps the snapshot of its full sync in its directory: not the
            // repository's.
            command.arg("--dir").arg(std::env::temp_dir());
            command.args(["--dbfilename", &format!("trs-test-{port}.rdb")]);
        }
        command.args(rest);
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{INSTALL}: {e}"));
        let node = Node {
            port,
            child: Some(child),
            config,
            password: None,
        };
        wait_until("redis-server to listen", Duration::from_secs(20), || {
            node.query::<String>(&redis::cmd("PING")).is_ok()
        });
        node
    }

    pub fn url(&self) -> String {
        match &self.password {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// Runs `cmd` on the node.
    pub fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        let mut conn = connection(&self.url())?;
        cmd.query(&mut conn)
    }

    /// A field of `INFO replication` (`role`, `connected_slaves`, `master_link_status`).
    pub fn replication(&self, field: &str) -> Option<String> {
        let info: String = self.query(redis::cmd("INFO").arg("replication")).ok()?;
        info.lines().find_map(|l| {
            l.trim_end()
                .strip_prefix(&format!("{field}:"))
                .map(str::to_owned)
        })
    }

    /// Kills the process (SIGKILL, by its pid), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Makes this replica a primary (`REPLICAOF NO ONE`).
    pub fn promote(&self) {
        let _: String = self
            .query(redis::cmd("REPLICAOF").arg("NO").arg("ONE"))
            .expect("REPLICAOF NO ONE");
        wait_until(
            "the replica to become a primary",
            Duration::from_secs(20),
            || self.replication("role").as_deref() == Some("master"),
        );
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
        if let Some(path) = self.config.take() {
            let _ = std::fs::remove_file(path);
        }
        let dir = std::env::temp_dir();
        let _ = std::fs::remove_file(dir.join(format!("trs-test-{}.rdb", self.port)));
        let _ = std::fs::remove_file(dir.join(format!("trs-nodes-{}.conf", self.port)));
    }
}

/// Waits until a marker written on `primary` is readable on `replica`: the replication stream
/// flows (after a full sync, Redis 7.0 may send a new replica nothing until its first ack).
pub fn wait_replicated(primary: &Node, replica: &Node) {
    let marker = format!("trs-test:marker:{}", free_port());
    let value = uuid::Uuid::new_v4().to_string();
    wait_until(
        "the replica to take the marker",
        Duration::from_secs(30),
        || {
            let _ = primary.query::<()>(
                redis::cmd("SET")
                    .arg(&marker)
                    .arg(&value)
                    .arg("PX")
                    .arg(60_000),
            );
            replica
                .query::<Option<String>>(redis::cmd("GET").arg(&marker))
                .ok()
                .flatten()
                .as_deref()
                == Some(value.as_str())
        },
    );
}

/// A TCP proxy on loopback between a replica and its primary that can hold the replication
/// stream back: paused, it forwards nothing either way (what it read stays in its buffers), so
/// the replica is really behind — unlike a replica stopped with SIGSTOP, whose socket buffer
/// holds the writes and which applies them before it is promoted.
pub struct Proxy {
    pub port: u16,
    paused: tokio::sync::watch::Sender<bool>,
    /// Where new connections go (an address that follows a promotion, as a managed service's
    /// name does).
    upstream: std::sync::Arc<std::sync::atomic::AtomicU16>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream_port: u16) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let port = listener.local_addr().expect("addr").port();
        let (paused, _) = tokio::sync::watch::channel(false);
        let pause = paused.clone();
        let upstream = std::sync::Arc::new(std::sync::atomic::AtomicU16::new(upstream_port));
        let target = upstream.clone();
        let task = tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                let to = target.load(std::sync::atomic::Ordering::SeqCst);
                let Ok(up) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await else {
                    continue;
                };
                let (down_read, down_write) = down.into_split();
                let (up_read, up_write) = up.into_split();
                tokio::spawn(pump(up_read, down_write, pause.subscribe()));
                tokio::spawn(pump(down_read, up_write, pause.subscribe()));
            }
        });
        Proxy {
            port,
            paused,
            upstream,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Sends new connections to `port` from now on (connections made before stay where they
    /// are).
    pub fn point_to(&self, port: u16) {
        self.upstream
            .store(port, std::sync::atomic::Ordering::SeqCst);
    }

    /// Holds everything back from now on.
    pub fn pause(&self) {
        self.paused.send_replace(true);
    }

    pub fn resume(&self) {
        self.paused.send_replace(false);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut paused: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0; 64 * 1024];
    loop {
        let Ok(n) = from.read(&mut buf).await else {
            return;
        };
        if n == 0 {
            return;
        }
        // Read while paused, or before: held until resumed, never forwarded meanwhile.
        if paused.wait_for(|p| !*p).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A Redis Cluster of the test's own: `primaries` primaries with `replicas` replicas each, on
/// free loopback ports, made with `redis-cli --cluster create`; every node killed when dropped.
pub struct Cluster {
    pub nodes: Vec<Node>,
}

impl Cluster {
    pub fn start(primaries: usize, replicas: usize) -> Cluster {
        let nodes: Vec<Node> = (0..primaries * (1 + replicas))
            .map(|_| Node::cluster_node())
            .collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        let status = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("redis-cli for the cluster: {e}"));
        assert!(status.success(), "redis-cli --cluster create failed");
        let cluster = Cluster { nodes };
        wait_until("the cluster to be up", Duration::from_secs(60), || {
            cluster.nodes.iter().all(|node| {
                node.query::<String>(redis::cmd("CLUSTER").arg("INFO"))
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
            }) && cluster
                .nodes
                .iter()
                .filter(|n| n.replication("role").as_deref() == Some("slave"))
                .count()
                == primaries * replicas
                && cluster.nodes.iter().all(|n| {
                    n.replication("role").as_deref() != Some("slave")
                        || n.replication("master_link_status").as_deref() == Some("up")
                })
        });
        cluster
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::url).collect()
    }
}
