//! A `redis-server` of the test's own that a test stops and starts again ([`OwnRedis`]): an
//! outage of the store, for the fleet's tests and for [`super::TestRedis`] when no Redis
//! answers.

use std::process::{Child, Command};

/// A `redis-server` of the test's own on a free port, that nothing else uses: it can be
/// stopped and started again. Known to be the process it started (see
/// [`super::Node`]): a port taken meanwhile has it started on another.
pub struct OwnRedis {
    pub port: u16,
    child: Option<Child>,
}

impl OwnRedis {
    pub fn start() -> OwnRedis {
        let mut tried = Vec::new();
        for _ in 0..10 {
            let mut redis = OwnRedis {
                port: crate::ports::free_port(),
                child: None,
            };
            match redis.try_start() {
                Ok(()) => return redis,
                Err(why) => tried.push(why),
            }
        }
        panic!("redis-server did not start on any of 10 free ports: {tried:?}");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts it again on its port and waits until it answers there as itself.
    pub fn start_again(&mut self) {
        if let Err(why) = self.try_start() {
            panic!("redis-server did not start again on its port: {why}");
        }
    }

    fn try_start(&mut self) -> Result<(), String> {
        let (stdout, stderr) = super::log_files(self.port);
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("these tests start their own `redis-server`, from PATH: {e} (install the redis-server package)")
            });
        let url = self.url();
        let child = self.child.insert(child);
        let started = super::listening(child, &url, self.port);
        if started.is_err() {
            self.stop();
        }
        started
    }

    /// Stops it, as an outage would.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.stop();
    }
}
