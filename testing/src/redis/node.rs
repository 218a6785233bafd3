//! A `redis-server` process of the test's own ([`Node`]): a primary, a replica, a Sentinel or
//! a cluster node, killed when dropped; and [`wait_replicated`], a replica caught up.

use std::process::{Command, Stdio};
use std::time::Duration;

use super::{connection, free_port, wait_until, INSTALL};

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

    /// A primary on a free port, without persistence, with more options
    /// (`--min-replicas-to-write`, …).
    pub fn primary_with(args: &[&str]) -> Node {
        Node::spawn(free_port(), args, None)
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
