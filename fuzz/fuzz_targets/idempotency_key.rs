//! `Idempotency-Key` of any bytes: no panic; a key that counts is 1 to 255 bytes.
#![no_main]

use http::{HeaderValue, Request};
use libfuzzer_sys::fuzz_target;
use tower_retry_safety::RetryPolicy;

fuzz_target!(|data: &[u8]| {
    let policy = RetryPolicy::builder()
        .honor_idempotency_key(true)
        .build()
        .unwrap();
    let mut req = Request::post("/v1/messages").body(()).unwrap();
    if let Ok(v) = HeaderValue::from_bytes(data) {
        req.headers_mut().insert("idempotency-key", v);
    }
    let verdict = policy.classify(&req);
    if verdict.is_keyed() {
        assert!(!data.is_empty() && data.len() <= 255);
    }
});
