//! The Stainless row's first caller: a client that retries as Stainless-generated SDKs
//! (OpenAI's) do, with none of this crate — a read timeout per attempt, sent as
//! `x-stainless-read-timeout` in seconds; `x-stainless-retry-count` (0 on the first attempt);
//! its own exponential backoff; the same idempotency key on every attempt of a write.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

use crate::deadline_chain::hop::Ledger;
use crate::deadline_chain::{request, SDK_DEADLINE};

/// The SDK's default: two retries.
const MAX_RETRIES: u32 = 2;
/// The SDK's first backoff; it doubles per retry (up to 8 s, never reached here).
const INITIAL_BACKOFF: Duration = Duration::from_millis(500);

/// One call, every attempt given up on after [`SDK_DEADLINE`] (each attempt's deadline is
/// put in the ledger before it is sent). True when an attempt answered 2xx.
pub async fn call(ledger: &Ledger, entry: SocketAddr, call: u32) -> bool {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let read_timeout = format!("{}", SDK_DEADLINE.as_secs_f64());
    for attempt in 0..=MAX_RETRIES {
        let deadline = Instant::now() + SDK_DEADLINE;
        ledger.set_deadline(call, attempt, deadline);
        let Ok(req) = request(entry, call, attempt)
            .header("x-stainless-read-timeout", read_timeout.as_str())
            .header("x-stainless-retry-count", attempt)
            .body(Full::new(Bytes::from_static(b"{}")))
        else {
            return false;
        };
        let sent = async {
            let res = client.request(req).await.ok()?;
            let status = res.status();
            res.into_body().collect().await.ok()?;
            Some(status)
        };
        match tokio::time::timeout_at(deadline, sent).await {
            Ok(Some(status)) if status.is_success() => return true,
            // What the SDKs retry: 408, 409, 429 and 5xx; anything else is final.
            Ok(Some(status))
                if !(status.is_server_error() || matches!(status.as_u16(), 408 | 409 | 429)) =>
            {
                return false
            }
            _ => {}
        }
        if attempt < MAX_RETRIES {
            tokio::time::sleep(backoff(call, attempt)).await;
        }
    }
    false
}

/// The SDK's backoff before retry `attempt + 1`: doubling from 500 ms, less up to a quarter
/// of jitter (here from the call's number, so a run is repeatable).
fn backoff(call: u32, attempt: u32) -> Duration {
    let full = INITIAL_BACKOFF * 2u32.pow(attempt);
    let jitter = f64::from(call.wrapping_mul(7919) % 100) / 400.0;
    full.mul_f64(1.0 - jitter)
}
