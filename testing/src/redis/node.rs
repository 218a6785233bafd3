//! A `redis-server` process of the test's own ([`Node`]): a primary, a replica, a Sentinel or
//! a cluster node, killed when dropped; and [`wait_replicated`], a replica caught up.
//!
//! A node is on a port that no other node of this process had ([`free_port`]), and is known to
//! be the process it started: `free_port` lets its port go before `redis-server` binds it, so
//! another process may take it meanwhile. The node that answers there is then asked its pid
//! (`INFO server`); a `redis-server` that could not bind (it exits) or a port that answers as
//! another process has the node started again on another port. Before this, a test could talk
//! to another test's Redis and never know.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{connection, wait_until, INSTALL};
use crate::ports::free_port;

/// How many ports a node is tried on before the test fails.
const ATTEMPTS: usize = 10;
/// How long a `redis-server` may take to listen, on a busy machine.
const LISTEN: Duration = Duration::from_secs(20);

/// A `redis-server` process of the test's own (a node, or a Sentinel), killed by its pid when
/// dropped, also when the test fails.
pub struct Node {
    pub port: u16,
    child: Option<Child>,
    /// A Sentinel's config file (Sentinel rewrites it), removed on drop.
    config: Option<PathBuf>,
    /// The password the node requires, if any (`url` carries it).
    password: Option<String>,
}

/// How to start a node on a given port: its arguments, and the config file (a Sentinel's)
/// written for that port, which then comes first.
struct Spec {
    args: Vec<String>,
    config: Option<(PathBuf, String)>,
    password: Option<String>,
}

impl Spec {
    /// A node without persistence on `port`, with `more` options.
    fn plain(port: u16, more: &[&str]) -> Spec {
        let mut args: Vec<String> = ["--port", &port.to_string(), "--bind", "127.0.0.1"]
            .into_iter()
            .chain(["--save", "", "--appendonly", "no"])
            .map(str::to_owned)
            .collect();
        // A replica keeps the snapshot of its full sync in its directory: not the
        // repository's.
        args.push("--dir".to_owned());
        args.push(std::env::temp_dir().display().to_string());
        args.push("--dbfilename".to_owned());
        args.push(format!("trs-test-{}-{port}.rdb", std::process::id()));
        args.extend(more.iter().map(|a| (*a).to_owned()));
        Spec {
            args,
            config: None,
            password: None,
        }
    }
}

impl Node {
    /// A primary on a free port, without persistence.
    pub fn primary() -> Node {
        Node::start(|port| Spec::plain(port, &[]))
    }

    /// A primary on a free port, without persistence, with more options
    /// (`--min-replicas-to-write`, …).
    pub fn primary_with(args: &[&str]) -> Node {
        Node::start(|port| Spec::plain(port, args))
    }

    /// A node for a Redis Cluster (`cluster-enabled yes`), its nodes file in the temp dir. Its
    /// cluster bus listens on the port plus 10000, which must be free too.
    pub fn cluster_node() -> Node {
        Node::start(|port| {
            // Its bus port is this process's too: `free_port` must not hand it to a server
            // that a test stops and starts again.
            let _ = port.checked_add(10_000).map(crate::ports::first_use);
            let nodes_file = nodes_file(port).display().to_string();
            let args = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                nodes_file.as_str(),
                "--cluster-node-timeout",
                "2000",
            ];
            Spec::plain(port, &args)
        })
    }

    /// A primary that requires `password` (and its replicas' primary link too).
    pub fn primary_with_password(password: &str) -> Node {
        Node::start(|port| Spec {
            password: Some(password.to_owned()),
            ..Spec::plain(port, &["--requirepass", password, "--masterauth", password])
        })
    }

    /// A replica of the node on `upstream_port`, both requiring `password`.
    pub fn replica_with_password(upstream_port: u16, password: &str) -> Node {
        let upstream = upstream_port.to_string();
        Node::start(|port| Spec {
            password: Some(password.to_owned()),
            ..Spec::plain(
                port,
                &[
                    "--replicaof",
                    "127.0.0.1",
                    upstream.as_str(),
                    "--requirepass",
                    password,
                    "--masterauth",
                    password,
                ],
            )
        })
    }

    /// A replica of the node (or proxy) on `upstream_port`.
    pub fn replica_of(upstream_port: u16) -> Node {
        let upstream = upstream_port.to_string();
        Node::start(|port| Spec::plain(port, &["--replicaof", "127.0.0.1", upstream.as_str()]))
    }

    /// A Sentinel on a free port that watches the primary on `primary_port` as `master`,
    /// alone (quorum 1), quick to act (down after 1 s).
    pub fn sentinel(master: &str, primary_port: u16) -> Node {
        Node::sentinel_with(master, primary_port, "")
    }

    /// [`Node::sentinel`] with more lines of config (`sentinel auth-pass …`).
    pub fn sentinel_with(master: &str, primary_port: u16, more: &str) -> Node {
        Node::start(|port| {
            let path = std::env::temp_dir()
                .join(format!("trs-sentinel-{}-{port}.conf", std::process::id()));
            let config = format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {master} 127.0.0.1 {primary_port} 1\n\
                 sentinel down-after-milliseconds {master} 1000\n\
                 sentinel failover-timeout {master} 2000\n\
                 sentinel parallel-syncs {master} 5\n{more}",
                dir = std::env::temp_dir().display()
            );
            Spec {
                args: vec!["--sentinel".to_owned()],
                config: Some((path, config)),
                password: None,
            }
        })
    }

    /// Starts the node `spec` makes for a free port, trying other ports while the one it got
    /// turns out to be taken.
    fn start(spec: impl Fn(u16) -> Spec) -> Node {
        let mut tried = Vec::new();
        for _ in 0..ATTEMPTS {
            let port = free_port();
            match Node::try_start(port, spec(port)) {
                Ok(node) => return node,
                Err(why) => tried.push(why),
            }
        }
        panic!("redis-server did not start on any of {ATTEMPTS} free ports: {tried:?}");
    }

    /// Starts `spec` on `port` and waits until it answers there as the process it started;
    /// `Err` if it exited (the port, or its cluster bus port, was taken) or another process
    /// answers on the port.
    fn try_start(port: u16, spec: Spec) -> Result<Node, String> {
        let mut command = Command::new("redis-server");
        let config = spec.config.map(|(path, text)| {
            std::fs::write(&path, text).expect("write the Sentinel config");
            path
        });
        // A config file comes first; the other options after it.
        command.args(&config);
        command.args(&spec.args);
        let (stdout, stderr) = log_files(port);
        let child = command
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("{INSTALL}: {e}"));
        let mut node = Node {
            port,
            child: Some(child),
            config,
            password: spec.password,
        };
        // Dropping `node` on an error kills the process and removes its files.
        let url = node.url();
        let child = node.child.as_mut().expect("just started");
        listening(child, &url, port)?;
        Ok(node)
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
        let rdb = format!("trs-test-{}-{}.rdb", std::process::id(), self.port);
        let _ = std::fs::remove_file(dir.join(rdb));
        let _ = std::fs::remove_file(nodes_file(self.port));
    }
}

/// A cluster node's nodes file (this process's: no other node of it has the port).
fn nodes_file(port: u16) -> PathBuf {
    std::env::temp_dir().join(format!("trs-nodes-{}-{port}.conf", std::process::id()))
}

/// Waits until the `redis-server` `child` answers at `url` (on `port`) as itself; `Err` if it
/// exited (its port, or its cluster bus port, was taken) or another process answers there.
pub(crate) fn listening(child: &mut Child, url: &str, port: u16) -> Result<(), String> {
    let pid = child.id();
    let start = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("port {port}: redis-server exited ({status})"));
        }
        let info = connection(url)
            .and_then(|mut c| redis::cmd("INFO").arg("server").query::<String>(&mut c));
        if let Ok(info) = info {
            return match process_id(&info) {
                Some(answered) if answered == pid => Ok(()),
                answered => Err(format!(
                    "port {port}: process {answered:?} answered, not redis-server {pid}"
                )),
            };
        }
        assert!(
            start.elapsed() < LISTEN,
            "gave up waiting for redis-server {pid} to listen on port {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `process_id` in `INFO server`.
fn process_id(info: &str) -> Option<u32> {
    info.lines()
        .find_map(|l| l.trim_end().strip_prefix("process_id:"))
        .and_then(|pid| pid.parse().ok())
}

/// Where a node's log goes: nowhere, or with `TRS_REDIS_LOGS=<dir>` set, to a file of its own
/// in that directory (`<pid of the test binary>-<port>-<n>.log`), kept after the test, to read
/// what a node did (a bind refused, a `REPLICAOF` it was sent, a Sentinel's `+tilt`).
pub(crate) fn log_files(port: u16) -> (Stdio, Stdio) {
    let Some(dir) = std::env::var_os("TRS_REDIS_LOGS") else {
        return (Stdio::null(), Stdio::null());
    };
    static STARTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = PathBuf::from(dir).join(format!("{}-{port}-{n}.log", std::process::id()));
    match std::fs::File::create(&path).and_then(|f| Ok((f.try_clone()?, f))) {
        Ok((out, err)) => (Stdio::from(out), Stdio::from(err)),
        Err(e) => panic!("TRS_REDIS_LOGS: {}: {e}", path.display()),
    }
}

/// Waits until a marker written on `primary` is readable on `replica`: the replication stream
/// flows (after a full sync, Redis 7.0 may send a new replica nothing until its first ack).
pub fn wait_replicated(primary: &Node, replica: &Node) {
    let marker = format!("trs-test:marker:{}", uuid::Uuid::new_v4());
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
