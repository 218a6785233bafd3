//! A Redis Cluster of the test's own ([`Cluster`]), made with `redis-cli --cluster create`.

use std::process::{Command, Stdio};
use std::time::Duration;

use super::{wait_until, Node};

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
