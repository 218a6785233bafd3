//! The deadline chain lab of `cargo run --example deadlines` (whose goals the end-to-end tests
//! assert): the chain's rows, the calls the SDK makes, and what is counted.

pub mod hop;
pub mod stainless;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;
use tower::{BoxError, ServiceExt};
use tower_retry_safety::deadline::Inbound;
use tower_retry_safety::{RetryPolicy, RetryPolicyBuilder};

use hop::Ledger;

/// How long the SDK waits for each call.
pub const SDK_DEADLINE: Duration = Duration::from_millis(400);
/// What a nested call keeps for the way back.
const MARGIN: Duration = Duration::from_millis(25);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Row {
    Today,
    Deadlines,
    OneLayer,
    /// The first caller speaks like a Stainless-generated SDK (OpenAI's): a read timeout per
    /// attempt in `x-stainless-read-timeout`, `x-stainless-retry-count` on its retries, its
    /// own backoff; the hops as in [`Row::Deadlines`].
    Stainless,
}

impl Row {
    pub const ALL: [Row; 4] = [Row::Today, Row::Deadlines, Row::OneLayer, Row::Stainless];

    pub fn name(self) -> &'static str {
        match self {
            Row::Today => "today",
            Row::Deadlines => "deadlines",
            Row::OneLayer => "deadlines+one-layer",
            Row::Stainless => "stainless-sdk",
        }
    }

    pub fn deadlines(self) -> bool {
        self != Row::Today
    }

    /// Every client's settings in this row; `nested`: a hop's client, inside a handler.
    fn policy(self, nested: bool) -> RetryPolicyBuilder {
        let base = RetryPolicy::builder()
            .max_retries(3)
            .backoff(Duration::from_millis(20), Duration::from_millis(80))
            .honor_idempotency_key_for_host("127.0.0.1")
            .no_budget();
        if !nested {
            let base = base.attempt_timeout(Duration::from_millis(250));
            // The SDK's deadline is the instant the ledger counts from: each call runs in
            // its scope (`run`), taken whole.
            let base = base.inherit_deadline(Some(Duration::ZERO));
            // Each hop waits up to its own timeout for the next one, as services do.
            return match self {
                Row::Today => base,
                _ => base.send_deadline_to("127.0.0.1"),
            };
        }
        let base = base.deadline(Duration::from_secs(2));
        match self {
            Row::Today => base.inherit_deadline(None),
            Row::Deadlines | Row::Stainless => base
                .send_deadline_to("127.0.0.1")
                .inherit_deadline(Some(MARGIN)),
            Row::OneLayer => base
                .send_deadline_to("127.0.0.1")
                .inherit_deadline(Some(MARGIN))
                .retries_when_caller_retries(0),
        }
    }
}

/// What C does with a call: even calls are reads, odd ones writes with a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The work is done, and the answer comes after the SDK's deadline.
    Slow,
    /// The first attempts are answered 503 (nothing done), each after a while.
    Failing,
    /// The work is done, and the first answer is lost.
    Lost,
    Fine,
}

pub fn fault(call: u32) -> Fault {
    match (call / 2) % 4 {
        0 => Fault::Slow,
        1 => Fault::Failing,
        2 => Fault::Lost,
        _ => Fault::Fine,
    }
}

/// What a row counted.
#[derive(Debug, Default)]
pub struct Tally {
    pub ok: u32,
    pub started_late: u32,
    pub applied_twice: u32,
    pub attempts_at_c: u32,
    pub wasted: Duration,
}

/// Runs `calls` SDK calls through A → B → C (or straight to C when `direct`), and counts,
/// once every hop has stopped working on them.
pub async fn run(row: Row, calls: u32, direct: bool) -> Result<Tally, BoxError> {
    let ledger = Arc::new(Ledger::default());
    let c = hop::serve(ledger.clone(), row, None).await?;
    let entry = if direct {
        c
    } else {
        let nested = || hop::outbound(row.policy(true).build().expect("policy"));
        let b = hop::serve(ledger.clone(), row, Some((c, nested()))).await?;
        hop::serve(ledger.clone(), row, Some((b, nested()))).await?
    };
    let sdk = hop::outbound(row.policy(false).build()?);
    let mut tasks = tokio::task::JoinSet::new();
    for call in 0..calls {
        if row == Row::Stainless {
            let ledger = ledger.clone();
            tasks.spawn(async move {
                crate::deadline_chain::stainless::call(&ledger, entry, call).await
            });
            continue;
        }
        let deadline = Instant::now() + SDK_DEADLINE;
        ledger.set_deadline(call, 0, deadline);
        let req = request(entry, call, 0).body(Full::new(Bytes::from_static(b"{}")))?;
        let sdk = sdk.clone();
        let call = tower_retry_safety::deadline::scope(Inbound::at(deadline), sdk.oneshot(req));
        tasks.spawn(async move {
            match call.await {
                Ok(res) => {
                    let ok = res.status().is_success();
                    let _ = res.into_body().collect().await;
                    ok
                }
                Err(_) => false,
            }
        });
    }
    let mut ok = 0;
    while let Some(done) = tasks.join_next().await {
        ok += u32::from(done.unwrap_or(false));
    }
    settle(&ledger).await;
    Ok(Tally {
        ok,
        started_late: ledger.started_late.load(Ordering::SeqCst),
        applied_twice: ledger.applied_twice(),
        attempts_at_c: ledger.attempts_at_c.load(Ordering::SeqCst),
        wasted: Duration::from_micros(ledger.wasted_us.load(Ordering::SeqCst)),
    })
}

/// The SDK's request for `call`, its attempt `attempt` (from 0): even calls are reads, odd
/// ones writes with a key.
pub fn request(entry: std::net::SocketAddr, call: u32, attempt: u32) -> http::request::Builder {
    let req = Request::builder()
        .uri(format!("http://{entry}/work"))
        .header("x-call", call)
        .header("x-sdk-attempt", attempt);
    if call % 2 == 1 {
        req.method("POST")
            .header("idempotency-key", format!("\"call-{call}\""))
    } else {
        req.method("GET")
    }
}

/// Waits until no hop is working and none has started anything for a while: the resends a
/// hop makes after the SDK gave up are counted too (up to the hops' own deadlines).
async fn settle(ledger: &Ledger) {
    let give_up = Instant::now() + Duration::from_secs(20);
    let mut quiet_since = Instant::now();
    let mut starts = ledger.starts.load(Ordering::SeqCst);
    while Instant::now() < give_up {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = ledger.starts.load(Ordering::SeqCst);
        if now != starts || ledger.running.load(Ordering::SeqCst) > 0 {
            starts = now;
            quiet_since = Instant::now();
        } else if quiet_since.elapsed() > Duration::from_millis(2500) {
            return;
        }
    }
}
