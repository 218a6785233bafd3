//! What the client's benches share: the statistics of `retry_safety_testing::bench`, the least
//! a `tower::retry` policy does, two-thread throughput and the cost of a budget deposit.

#![allow(dead_code)] // each bench uses its part

pub mod deposits;
pub mod threads;

use std::future::Ready;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use tower::retry::Policy;

pub type Req = Request<Full<Bytes>>;

#[allow(unused_imports)] // each bench uses its part
pub use retry_safety_testing::bench::{median, print_ratio, ratio_of, Ratio};

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
