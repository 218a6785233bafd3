//! A scripted inner service: each call pops the next outcome and records what it was sent.
//! Clones share the script, so the layer's retry clone is seen too.

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, Method, Request, Response, StatusCode, Uri, Version};
use tokio::time::Instant;
use tower::{BoxError, Service};

#[derive(Clone, Debug)]
pub enum Outcome {
    Status(u16, Vec<(&'static str, &'static str)>),
    Refused,
    Reset,
    Timeout,
}

pub use Outcome::*;

pub fn ok() -> Outcome {
    Status(200, vec![])
}

pub fn status(code: u16) -> Outcome {
    Status(code, vec![])
}

#[derive(Clone, Debug)]
pub struct Call {
    pub at: Duration,
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    pub headers: HeaderMap,
    pub tag: Option<Tag>,
}

/// A caller's extension, to see that every attempt carries the caller's extensions.
#[derive(Clone, Debug, PartialEq)]
pub struct Tag(pub &'static str);

#[derive(Default)]
struct Shared {
    outcomes: VecDeque<Outcome>,
    calls: Vec<Call>,
}

#[derive(Clone)]
pub struct Script {
    shared: Arc<Mutex<Shared>>,
    start: Instant,
    /// This clone's readiness: `call` without `poll_ready` first is a bug in the caller.
    ready: bool,
    /// How many `poll_ready`s return Pending before Ready (for every clone).
    pending_polls: Arc<Mutex<u32>>,
    fail_ready: bool,
}

impl Script {
    pub fn new(outcomes: impl IntoIterator<Item = Outcome>) -> Script {
        Script {
            shared: Arc::new(Mutex::new(Shared {
                outcomes: outcomes.into_iter().collect(),
                calls: Vec::new(),
            })),
            start: Instant::now(),
            ready: false,
            pending_polls: Arc::default(),
            fail_ready: false,
        }
    }

    pub fn pending_before_ready(self, n: u32) -> Script {
        *self.pending_polls.lock().unwrap() = n;
        self
    }

    pub fn fail_ready_after_first(mut self) -> Script {
        self.fail_ready = true;
        self
    }

    pub fn calls(&self) -> Vec<Call> {
        self.shared.lock().unwrap().calls.clone()
    }

    pub fn count(&self) -> usize {
        self.shared.lock().unwrap().calls.len()
    }

    pub fn call_times_ms(&self) -> Vec<u128> {
        self.calls().iter().map(|c| c.at.as_millis()).collect()
    }
}

impl<B> Service<Request<B>> for Script {
    type Response = Response<String>;
    type Error = BoxError;
    type Future = std::future::Ready<Result<Response<String>, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if self.fail_ready && !self.shared.lock().unwrap().calls.is_empty() {
            return Poll::Ready(Err("the pool is closed".into()));
        }
        let mut pending = self.pending_polls.lock().unwrap();
        if *pending > 0 {
            *pending -= 1;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.ready = true;
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        assert!(self.ready, "call without poll_ready");
        self.ready = false;
        let mut shared = self.shared.lock().unwrap();
        shared.calls.push(Call {
            at: self.start.elapsed(),
            method: req.method().clone(),
            uri: req.uri().clone(),
            version: req.version(),
            headers: req.headers().clone(),
            tag: req.extensions().get::<Tag>().cloned(),
        });
        let outcome = shared.outcomes.pop_front().unwrap_or_else(ok);
        std::future::ready(match outcome {
            Status(code, headers) => {
                let mut res = Response::new(format!("{code}"));
                *res.status_mut() = StatusCode::from_u16(code).unwrap();
                for (k, v) in headers {
                    res.headers_mut().insert(k, v.parse().unwrap());
                }
                Ok(res)
            }
            Refused => Err(io::Error::from(io::ErrorKind::ConnectionRefused).into()),
            Reset => Err(io::Error::from(io::ErrorKind::ConnectionReset).into()),
            Timeout => Err(tower::timeout::error::Elapsed::new().into()),
        })
    }
}
