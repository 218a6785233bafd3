//! The policy in a reqwest-middleware stack, against the fault server on loopback.
//!
//! Run: `cargo run --example reqwest --features reqwest-middleware`

use retry_safety_testing::fault_server;

use std::time::Duration;

use fault_server::{Fault, FaultServer};
use reqwest_middleware::ClientBuilder;
use tower_retry_safety::{Idempotency, RetryPolicy, RetryReport, RetrySafetyMiddleware};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = FaultServer::start().await;
    let policy = RetryPolicy::builder()
        .max_retries(3)
        .backoff(Duration::from_millis(50), Duration::from_secs(2))
        .build()?;
    let client = ClientBuilder::new(
        reqwest::Client::builder()
            // reqwest's timeout applies to each attempt.
            .timeout(Duration::from_millis(300))
            .build()?,
    )
    .with(RetrySafetyMiddleware::new(policy))
    .build();

    // A read with a 503 on its first attempt: retried.
    let res = client
        .get(server.url("report"))
        .header("x-fault", Fault::UnavailableAfterApply.name())
        .send()
        .await?;
    println!(
        "GET /ops/report -> {} after {} attempt(s)",
        res.status(),
        RetryReport::of_reqwest(&res).map_or(0, RetryReport::attempts)
    );

    // A write whose response is lost after it was applied: not retried, and the error says so.
    let sent = client
        .post(server.url("send-email"))
        .header("x-fault", Fault::SlowAfterApply.name())
        .with_extension(Idempotency::NonIdempotent)
        .body("{\"to\":\"a@example.com\"}")
        .send()
        .await;
    match sent {
        Ok(res) => println!("POST /ops/send-email -> {}", res.status()),
        Err(err) => match tower_retry_safety::Error::from_reqwest_middleware(&err) {
            Some(e) => println!(
                "POST /ops/send-email failed (ambiguous: {}, attempts: {}):\n  {e}",
                e.is_ambiguous(),
                e.attempts()
            ),
            None => println!("POST /ops/send-email failed: {err}"),
        },
    }
    println!(
        "emails sent on the server: {}",
        server.applied("send-email")
    );
    Ok(())
}
