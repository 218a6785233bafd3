//! The Redis a test uses ([`TestRedis`]): `REDIS_URL`, the local default, or a
//! `redis-server` of the test's own; the keys under the test's prefix, counted and deleted
//! when it ends.

use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use super::OwnRedis;
use super::{connection, INSTALL};

const LOCAL: &str = "redis://127.0.0.1:6379";

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
