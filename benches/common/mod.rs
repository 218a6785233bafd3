//! What the benches share: the median of samples, the least a `tower::retry` policy does,
//! two-thread throughput and the cost of a budget deposit.

#![allow(dead_code)] // each bench uses its part

pub mod deposits;
pub mod threads;

use std::future::Ready;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use tower::retry::Policy;

pub type Req = Request<Full<Bytes>>;

/// Runs `$body` `$n` times and pushes the mean nanoseconds per run onto `$samples`.
#[macro_export]
macro_rules! batch {
    ($samples:expr, $n:expr, $body:expr) => {{
        let start = std::time::Instant::now();
        for _ in 0..$n {
            $body;
        }
        $samples.push(start.elapsed().as_nanos() as f64 / $n as f64);
    }};
}

/// The median of the samples (sorts them).
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The least a `tower::retry` policy does: keep a copy of the request, never retry.
#[derive(Clone)]
pub struct CloneNeverRetry;

impl<Res, E> Policy<Req, Res, E> for CloneNeverRetry {
    type Future = Ready<()>;

    fn retry(&mut self, _: &mut Req, _: &mut Result<Res, E>) -> Option<Ready<()>> {
        None
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        let mut copy = Request::new(req.body().clone());
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        *copy.headers_mut() = req.headers().clone();
        Some(copy)
    }
}
