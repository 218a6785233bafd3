//! Route templates and paths of any text: `build()` and `classify` never panic, and a refused
//! template is named in the error.
#![no_main]

use http::{Method, Request};
use libfuzzer_sys::fuzz_target;
use tower_retry_safety::{Idempotency, RetryPolicy};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (template, path) = text.split_once('\n').unwrap_or((&text, "/"));
    match RetryPolicy::builder()
        // NonIdempotent, so that every spelling of the path is looked at.
        .route(Method::POST, template, Idempotency::NonIdempotent)
        .build()
    {
        Ok(policy) => {
            if let Ok(req) = Request::post(path).body(()) {
                let _ = policy.classify(&req);
            }
        }
        Err(e) => assert!(e.to_string().contains(template)),
    }
});
