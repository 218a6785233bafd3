//! The replay buffer's edge cases in the reqwest-middleware adapter: a body read past the limit
//! after its attempt failed is not sent again (found by an adversarial review).
#![cfg(feature = "reqwest-middleware")]

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Extensions;
use http_body_util::BodyExt;
use reqwest_middleware::{ClientBuilder, Middleware, Next};
use tower_retry_safety::service::NotReplayable;
use tower_retry_safety::{RetryPolicy, RetryReport, RetrySafetyMiddleware};

/// A middleware after ours, standing for a transport that keeps reading the body after it
/// failed the attempt: on the first attempt it hands the body to a task that reads one frame
/// every 30 ms, and fails at once; on later attempts it reads the body and answers 200.
#[derive(Clone, Default)]
struct KeepsReading {
    calls: Arc<AtomicUsize>,
    bodies: Arc<Mutex<Vec<Bytes>>>,
}

#[async_trait::async_trait]
impl Middleware for KeepsReading {
    async fn handle(
        &self,
        mut req: reqwest::Request,
        _: &mut Extensions,
        _: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let mut body = req.body_mut().take().expect("a body");
        if n == 0 {
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    match body.frame().await {
                        Some(Ok(_)) => {}
                        _ => break,
                    }
                }
            });
            return Err(reqwest_middleware::Error::middleware(io::Error::from(
                io::ErrorKind::ConnectionReset,
            )));
        }
        let got = body
            .collect()
            .await
            .map_err(reqwest_middleware::Error::Reqwest)?;
        self.bodies.lock().unwrap().push(got.to_bytes());
        Ok(reqwest::Response::from(http::Response::new("stored")))
    }
}

/// Found in review, fixed: as in the layer, the adapter checks the recording when the attempt fails and not
/// when the body comes back: the body went past the 50-byte buffer while the last attempt's
/// transport still held it, and the retry is sent an empty body (stored with 200) in place
/// of the 100 bytes streamed.
#[tokio::test(start_paused = true)]
async fn a_body_that_went_past_the_limit_after_the_attempt_failed_is_not_sent_again() {
    let policy = RetryPolicy::builder()
        .max_retries(3)
        .jitter(false)
        .backoff(Duration::from_millis(10), Duration::from_millis(10))
        .no_budget()
        .replay_buffer(50)
        .build()
        .unwrap();
    let keeps = KeepsReading::default();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetrySafetyMiddleware::new(policy))
        .with(keeps.clone())
        .build();
    let whole: Vec<u8> = (0..100u8).collect();
    let chunks: Vec<io::Result<Bytes>> = whole
        .chunks(10)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    let out = client
        .put("http://api.test/v1/files/1")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await;
    let sent_again = keeps.bodies.lock().unwrap().clone();
    assert_eq!(sent_again, Vec::<Bytes>::new());
    assert_eq!(keeps.calls.load(Ordering::SeqCst), 1);
    let err = out.expect_err("the only attempt failed");
    let report = tower_retry_safety::Error::from_reqwest_middleware(&err)
        .and_then(|e| e.report())
        .cloned()
        .map(|r: RetryReport| r.body_not_replayable());
    assert_eq!(report, Some(Some(NotReplayable::OverLimit { limit: 50 })));
}
