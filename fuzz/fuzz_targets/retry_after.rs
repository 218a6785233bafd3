//! `Retry-After` and `retry-after-ms` of any bytes: no panic, and no delay above the cap.
#![no_main]

use std::time::Duration;

use http::{HeaderValue, Request, Response};
use libfuzzer_sys::fuzz_target;
use tower_retry_safety::{FailureClass, RetryPolicy};

fuzz_target!(|data: &[u8]| {
    let split = data
        .first()
        .map_or(0, |b| *b as usize % (data.len().max(1)));
    let (a, b) = data.split_at(split);
    let cap = Duration::from_secs(30);
    let policy = RetryPolicy::builder().max_retry_after(cap).build().unwrap();
    let verdict = policy.classify(&Request::get("/").body(()).unwrap());
    let mut res = Response::builder().status(503);
    if let Ok(v) = HeaderValue::from_bytes(a) {
        res = res.header("retry-after", v);
    }
    if let Ok(v) = HeaderValue::from_bytes(b) {
        res = res.header("retry-after-ms", v);
    }
    let c = policy.classify_response(&verdict, &res.body(()).unwrap());
    if c.class() == FailureClass::RetryableResponse {
        assert!(c.retry_after().is_none_or(|d| d <= cap));
    }
});
