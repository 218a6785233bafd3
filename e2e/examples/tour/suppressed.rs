//! One suppressed write, as the caller sees it: the error and what it says.

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{ServiceBuilder, ServiceExt};
use tower_retry_safety::RetryPolicy;

use crate::fault_server::{Fault, FaultServer};
use crate::PER_ATTEMPT;

/// One suppressed write, as a caller sees it.
pub(crate) async fn show_suppressed_error() -> Result<(), Box<dyn std::error::Error>> {
    let server = FaultServer::start().await;
    let svc = ServiceBuilder::new()
        .layer(RetryPolicy::builder().build()?)
        .timeout(PER_ATTEMPT)
        .service(Client::builder(TokioExecutor::new()).build_http());
    let url = format!(
        "http://{}/v1/tools/execute/GMAIL_SEND_EMAIL?api_key=sk-not-printed",
        server.addr()
    );
    let req = Request::post(url)
        .header("x-fault", Fault::SlowAfterApply.name())
        .header("x-request-id", "req-7f3a")
        .header(
            "idempotency-key",
            "\"3f9c2b1e-5d4a-4e8b-9c7d-1a2b3c4d5e6f\"",
        )
        .body(Full::new(Bytes::from_static(b"{\"to\":\"a@example.com\"}")))?;
    let Err(err) = svc.oneshot(req).await else {
        return Err("expected the slow write to fail".into());
    };
    println!("\nOne suppressed write, as the caller sees it. This example sent it with");
    println!("`x-request-id: req-7f3a` and `Idempotency-Key: \"3f9c2b1e-...\"` (both set by");
    println!("the example itself, as an SDK would), to a server that applies it and answers");
    println!(
        "too late for the client's {} ms per-attempt timeout:\n",
        PER_ATTEMPT.as_millis()
    );
    println!("  {err}\n");
    println!("  is_ambiguous()      {}", err.is_ambiguous());
    println!("  retry_suppressed()  {}", err.retry_suppressed());
    println!("  attempts()          {}", err.attempts());
    println!("  stop_reason()       {:?}", err.stop_reason());
    println!(
        "  request_id()        {:?} (set by this example)",
        err.request_id()
    );
    println!(
        "  idempotency_key()   {:?} (set by this example)",
        err.idempotency_key()
    );
    if let (Some(first), Some(last)) = (err.first_attempt_at(), err.last_attempt_at()) {
        println!("  first_attempt_at()  {}", httpdate::fmt_http_date(first));
        println!("  last_attempt_at()   {}", httpdate::fmt_http_date(last));
    }
    println!("  crate_version()     {}", err.crate_version());
    let mut source = std::error::Error::source(&err);
    while let Some(cause) = source {
        println!("  caused by           {cause}");
        source = cause.source();
    }
    println!(
        "  side effects applied on the server: {} (sent once, not twice)",
        server.applied("/v1/tools/execute/GMAIL_SEND_EMAIL")
    );
    Ok(())
}
