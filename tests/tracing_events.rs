//! The layer's `tracing` events: debug per retry, warn per suppressed retry, with structured
//! fields and nothing from the query string, the headers or the body.

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Request;
use support::script::{ok, status, Reset, Script};
use tower::{Layer, ServiceExt};
use tower_retry_safety::RetryPolicy;

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture(f: impl FnOnce()) -> String {
    let buf = Buffer::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .without_time()
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    let out = buf.0.lock().unwrap().clone();
    String::from_utf8(out).unwrap()
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
        .block_on(f)
}

fn policy() -> RetryPolicy {
    RetryPolicy::builder()
        .jitter(false)
        .backoff(Duration::from_millis(100), Duration::from_secs(1))
        .no_budget()
        .build()
        .unwrap()
}

#[test]
fn a_retry_is_a_debug_event_with_fields() {
    let logs = capture(|| {
        block_on(async {
            let req = Request::get("http://h/v1/items/7?token=sekrit")
                .header("authorization", "Bearer sekrit")
                .body(String::new())
                .unwrap();
            policy()
                .layer(Script::new([status(503), ok()]))
                .oneshot(req)
                .await
                .unwrap();
        })
    });
    let line = logs
        .lines()
        .find(|l| l.contains("retrying request"))
        .expect(&logs);
    assert!(line.trim_start().starts_with("DEBUG"), "{line}");
    for field in [
        "method=GET",
        "path=\"/v1/items/7\"",
        "attempt=1",
        "class=\"retryable-response\"",
        "status=503",
        "delay_ms=100",
    ] {
        assert!(line.contains(field), "{field} missing in {line}");
    }
    assert!(!logs.contains("sekrit"), "{logs}");
}

#[test]
fn a_suppressed_retry_is_a_warn_event_with_fields() {
    let logs = capture(|| {
        block_on(async {
            let req = Request::post("http://h/v1/tools/execute?to=a@example.com")
                .header("x-request-id", "req-1")
                .header("cookie", "session=sekrit")
                .body("{\"card\":\"4242\"}".to_owned())
                .unwrap();
            policy()
                .layer(Script::new([Reset]))
                .oneshot(req)
                .await
                .unwrap_err();
        })
    });
    let line = logs
        .lines()
        .find(|l| l.contains("retry suppressed"))
        .expect(&logs);
    assert!(line.trim_start().starts_with("WARN"), "{line}");
    for field in [
        "method=POST",
        "path=\"/v1/tools/execute\"",
        "attempt=1",
        "class=\"ambiguous\"",
        "verdict_source=\"method\"",
        "request_id=\"req-1\"",
    ] {
        assert!(line.contains(field), "{field} missing in {line}");
    }
    for leak in ["sekrit", "4242", "a@example.com"] {
        assert!(!logs.contains(leak), "{leak} in {logs}");
    }
}
