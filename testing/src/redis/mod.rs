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

use std::time::Duration;

mod cluster;
mod node;
mod own;
mod proxy;
mod test_redis;

pub use cluster::Cluster;
pub(crate) use node::{listening, log_files};
pub use node::{wait_replicated, Node};
pub use own::OwnRedis;
pub use proxy::Proxy;
pub use test_redis::{count_keys, TestRedis};

/// The store's timeouts (a call's round trip, and `WAIT` for a replica) where a scenario
/// needs its calls to succeed and does not test the timeouts themselves. A call on a fresh
/// connection resolves the primary through Sentinel, connects, authenticates and waits for a
/// replica: in a CI run beside a build on two cores, a first `begin` did not get through
/// within the defaults (1 s and 500 ms), and a test about a password failed on it.
pub const PATIENT: Duration = Duration::from_secs(10);

/// What to do when no Redis can be found or started, in one line.
pub const INSTALL: &str = "these tests need Redis: set REDIS_URL, run redis-server on \
127.0.0.1:6379, or install redis-server (e.g. `apt-get install redis-server`) so they start \
their own";

fn connection(url: &str) -> redis::RedisResult<redis::Connection> {
    redis::Client::open(url)?.get_connection_with_timeout(Duration::from_millis(500))
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
