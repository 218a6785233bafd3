//! Captures what `tracing` prints while a closure runs.

use std::io::Write;
use std::sync::{Arc, Mutex};

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

/// Every event at debug or above, formatted, while `f` runs. Tests that capture share their
/// binary with others that do not (one binary per area): see `spans::keep_interest_per_event`.
pub fn capture<T>(f: impl FnOnce() -> T) -> (String, T) {
    crate::spans::keep_interest_per_event();
    let buf = Buffer::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .without_time()
        .with_writer(move || writer.clone())
        .finish();
    let out = tracing::subscriber::with_default(subscriber, f);
    let logs = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    (logs, out)
}

/// Runs `f` on a current-thread runtime with paused time.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
        .block_on(f)
}
