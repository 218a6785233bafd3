//! The Redis rows: the floor (the two round trips any idempotency layer over Redis needs),
//! the layer over `RedisStore`, and the layer on a primary with one replica that the bench
//! starts itself, with and without waiting for the replica.

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};

use super::{handler, keyed_post, layered, serve};

/// The Redis floor and the layer over `RedisStore` (their URLs), under a fresh key prefix,
/// which `clean` deletes.
pub(crate) struct RedisVariants(pub(crate) String, pub(crate) String, String);

impl RedisVariants {
    /// Deletes the run's keys: the bench leaves nothing behind.
    pub(crate) fn clean(&self) {
        let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
        let client = redis::Client::open(url.as_str()).expect("redis url");
        let mut con = client.get_connection().expect("redis");
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", self.2))
            .query(&mut con)
            .expect("KEYS");
        for chunk in keys.chunks(1000) {
            let () = redis::cmd("DEL").arg(chunk).query(&mut con).expect("DEL");
        }
    }
}

pub(crate) async fn redis_variants() -> RedisVariants {
    use tower_idempotency_keys::stores::RedisStore;
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let prefix = format!("trs-bench-{nanos}:");
    let floor = redis_floor(&url, format!("{prefix}floor:")).await;
    let store = RedisStore::connect(&url)
        .await
        .expect("redis")
        .prefix(format!("{prefix}layer:"));
    RedisVariants(floor, layered(store).await, prefix)
}

/// The Redis floor on the Redis at `url`, its keys under `prefix`: its URL.
async fn redis_floor(url: &str, prefix: String) -> String {
    let client = redis::Client::open(url).expect("redis url");
    let manager = redis::aio::ConnectionManager::new(client)
        .await
        .expect("redis");
    serve(move |req: Request<Incoming>| {
        let (mut con, prefix) = (manager.clone(), prefix.clone());
        async move {
            let key = format!(
                "{prefix}{}",
                req.headers()
                    .get("idempotency-key")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
            );
            let claimed: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg("in-flight")
                .arg("NX")
                .arg("PX")
                .arg(60_000)
                .query_async(&mut con)
                .await
                .expect("SET NX");
            black_box(claimed);
            let res = handler(req).await;
            let () = redis::cmd("SET")
                .arg(&key)
                .arg("{\"id\":\"msg_1\"}")
                .arg("PX")
                .arg(86_400_000)
                .query_async(&mut con)
                .await
                .expect("SET");
            Ok(res)
        }
    })
    .await
}

/// Redis's own count of the commands a keyed request sends, floor and layer (`INFO
/// commandstats` before and after a batch, on the bench's own primary where nothing else runs:
/// the layer there is `idem_redis_pair`'s, the same store as `idem_redis`). A command that a
/// script runs is counted as well as the script's own call.
pub(crate) async fn print_redis_counts(client: &Client<HttpConnector, Full<Bytes>>, pair: &Pair) {
    use std::collections::BTreeMap;
    const N: u64 = 200;
    let url = format!("redis://127.0.0.1:{}", pair.ports[0]);
    let floor = redis_floor(&url, "bench-floor:".into()).await;
    let mut con = redis::Client::open(url.as_str())
        .and_then(|c| c.get_connection())
        .expect("the pair's primary");
    let mut stats = || -> BTreeMap<String, u64> {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut con)
            .expect("INFO");
        info.lines()
            .filter_map(|line| {
                let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = rest.strip_prefix("calls=")?.split(',').next()?;
                Some((name.to_owned(), calls.parse().ok()?))
            })
            .collect()
    };
    for (name, url) in [("redis_floor", &floor), ("idem_redis", &pair.wait0)] {
        for _ in 0..20 {
            keyed_post(client, url).await;
        }
        let before = stats();
        for _ in 0..N {
            keyed_post(client, url).await;
        }
        let after = stats();
        let mut total = 0.0;
        for (command, calls) in &after {
            // The bench's own INFO, and the replica's acknowledgements.
            if command == "info" || command == "replconf" {
                continue;
            }
            let per = (calls - before.get(command).copied().unwrap_or(0)) as f64 / N as f64;
            if per > 0.0 {
                println!("count {name}.calls.{command} {per:.3}");
                total += per;
            }
        }
        println!("count {name}.calls {total:.3} (commands Redis ran per request)");
    }
}

/// A primary with one replica, of the bench's own, and the layer over `RedisStore` on it not
/// waiting (`wait0`) and waiting for the replica (`wait1`). The processes are killed when it is
/// dropped (their keys go with them). `None`, with a line saying why, without `redis-server`.
pub(crate) struct Pair {
    children: Vec<std::process::Child>,
    ports: [u16; 2],
    pub(crate) wait0: String,
    pub(crate) wait1: String,
}

impl Drop for Pair {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        // A replica keeps the snapshot of its full sync.
        for port in &self.ports {
            let _ =
                std::fs::remove_file(std::env::temp_dir().join(format!("trs-bench-{port}.rdb")));
        }
    }
}

pub(crate) async fn redis_pair() -> Option<Pair> {
    use std::process::{Command, Stdio};
    use tower_idempotency_keys::stores::RedisStore;
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port")
    };
    let spawn = |port: u16, more: &[String]| {
        Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(std::env::temp_dir())
            .args(["--dbfilename", &format!("trs-bench-{port}.rdb")])
            .args(more)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
    };
    let (primary, replica) = (free(), free());
    let mut pair = Pair {
        children: Vec::new(),
        ports: [primary, replica],
        wait0: String::new(),
        wait1: String::new(),
    };
    match spawn(primary, &[]) {
        Ok(child) => pair.children.push(child),
        Err(e) => {
            println!("(the idem_redis_wait1 rows need redis-server on PATH: {e})");
            return None;
        }
    }
    let replica_of = [
        "--replicaof".to_owned(),
        "127.0.0.1".to_owned(),
        primary.to_string(),
    ];
    pair.children
        .push(spawn(replica, &replica_of).expect("redis-server"));
    // Until a marker written on the primary is read on the replica: the stream flows.
    let url = format!("redis://127.0.0.1:{primary}");
    let replica_url = format!("redis://127.0.0.1:{replica}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let flows = (|| -> redis::RedisResult<bool> {
            let mut p = redis::Client::open(url.as_str())?.get_connection()?;
            let mut r = redis::Client::open(replica_url.as_str())?.get_connection()?;
            let () = redis::cmd("SET")
                .arg("trs-bench-marker")
                .arg(primary)
                .query(&mut p)?;
            let seen: Option<u16> = redis::cmd("GET").arg("trs-bench-marker").query(&mut r)?;
            Ok(seen == Some(primary))
        })();
        if flows.unwrap_or(false) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the bench's replica never synced"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let store = |replicas| {
        // A generous replica timeout: the bench measures the cost of waiting, and a loaded
        // machine must not turn a slow acknowledgement into a 503.
        RedisStore::builder(&url)
            .wait_for_replicas(replicas)
            .replica_timeout(Duration::from_secs(5))
            .prefix("bench:")
            .connect()
    };
    pair.wait0 = layered(store(0).await.expect("the pair's primary")).await;
    pair.wait1 = layered(store(1).await.expect("the pair's primary")).await;
    Some(pair)
}
