//! Client side: a recording inner service (no server: the layer's own decisions) on paused
//! time, shared by the tests of what every resend and hedge carries and when the deadline ends
//! them: the n-th call's wait and status, what each call saw, and a policy without jitter or
//! budget that numbers its attempts.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri, Version};
use tokio::time::Instant;
use tower_retry_safety::{RetryPolicy, RetryPolicyBuilder};

/// A caller's extension, to see it on every attempt.
#[derive(Clone, Debug, PartialEq)]
pub struct Tag(pub &'static str);

#[derive(Debug)]
pub struct Seen {
    pub at: Duration,
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    pub headers: HeaderMap,
    pub tag: Option<Tag>,
}

pub type Log = Arc<Mutex<Vec<Seen>>>;

/// The n-th call (from 0) waits `plan[n].0` ms and answers status `plan[n].1` (the last one
/// repeats); a status of 1014 answers 200 with `grpc-status: 14`.
pub fn recording(
    plan: &'static [(u64, u16)],
) -> (
    impl tower::Service<
            Request<String>,
            Response = Response<String>,
            Error = Infallible,
            Future = impl Send,
        > + Clone,
    Log,
) {
    let log: Log = Arc::default();
    let seen = log.clone();
    let t0 = Instant::now();
    let svc = tower::service_fn(move |req: Request<String>| {
        let n = {
            let mut log = seen.lock().unwrap();
            log.push(Seen {
                at: t0.elapsed(),
                method: req.method().clone(),
                uri: req.uri().clone(),
                version: req.version(),
                headers: req.headers().clone(),
                tag: req.extensions().get::<Tag>().cloned(),
            });
            log.len() - 1
        };
        let (delay, status) = plan[n.min(plan.len() - 1)];
        async move {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            let mut res = Response::new(String::from("ok"));
            if status == 1014 {
                res.headers_mut()
                    .insert("content-type", HeaderValue::from_static("application/grpc"));
                res.headers_mut()
                    .insert("grpc-status", HeaderValue::from_static("14"));
            } else {
                *res.status_mut() = StatusCode::from_u16(status).unwrap();
            }
            Ok::<_, Infallible>(res)
        }
    });
    (svc, log)
}

pub fn base() -> RetryPolicyBuilder {
    RetryPolicy::builder()
        .jitter(false)
        .backoff(Duration::from_millis(100), Duration::from_secs(1))
        .max_retries(5)
        .no_budget()
        .attempt_header(Some(http::HeaderName::from_static("x-attempt")))
}

pub fn calls(log: &Log) -> usize {
    log.lock().unwrap().len()
}

pub fn values(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}
