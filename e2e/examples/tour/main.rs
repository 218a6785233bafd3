//! The tour: the same faulty workload through a typical retry stack and through this layer.
//!
//! A hyper server on 127.0.0.1 counts side effects per operation and injects one fault into
//! each operation's first attempt: ok, response lost after the write was applied, slow response
//! after apply, 503 after apply, 429 before apply, 500 before apply. 120 writes (POST) and 120
//! reads (GET), each stack against a fresh server. Two rows hedge: tower's `hedge` with a
//! policy that clones every request, and this crate's `Hedge`, which never hedges a write.
//!
//! Then reads whose body is cut mid-way: 120 GETs per stack, half of 16 KiB and half of 1 MiB,
//! from a server that supports `Range` and sends a strong ETag. Half of the GETs get their
//! first response cut, right after the head or half-way through the body.
//!
//! Run: `cargo run --example tour` (from the repository's root: the tour is an example of the
//! unpublished end-to-end package, which builds the client with its reqwest adapter and the
//! server beside it).

mod cut_reads;
mod stacks;
mod suppressed;

use retry_safety_testing::{cut_server, fault_server};

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cut_reads::{cut_reads, reqwest_get, tower_get, CUT_OPS_PER_SIZE};
use fault_server::{Fault, FaultServer};
use http::{Method, Request};
use http_body_util::Full;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use stacks::{reqwest_sender, tower_sender, HedgeAll, TypicalPolicy};
use tower::ServiceBuilder;
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};
use tower_retry_safety::{Hedge, RetryPolicy, RetryPolicyBuilder};

const OPS_PER_FAULT: usize = 20;
const PER_ATTEMPT: Duration = Duration::from_millis(250);

type Req = Request<Full<Bytes>>;
type BoxFut = Pin<Box<dyn Future<Output = Option<u16>> + Send>>;
/// Sends one request; the status it ended with, or `None` for an error.
type Sender = Arc<dyn Fn(Method, String, Fault) -> BoxFut + Send + Sync>;

struct Row {
    name: &'static str,
    applied_twice: usize,
    reads_recovered: usize,
    writes_ok: usize,
    attempts: u32,
}

async fn run(name: &'static str, send: Sender) -> Row {
    run_against(name, send, FaultServer::start().await).await
}

async fn run_against(name: &'static str, send: Sender, server: FaultServer) -> Row {
    let mut tasks = tokio::task::JoinSet::new();
    for (i, fault) in Fault::ALL
        .into_iter()
        .flat_map(|f| std::iter::repeat_n(f, OPS_PER_FAULT))
        .enumerate()
    {
        for method in [Method::POST, Method::GET] {
            let url = server.url(&format!("{}-{i}", method.as_str().to_lowercase()));
            let send = send.clone();
            tasks.spawn(async move { (method.clone(), send(method, url, fault).await) });
        }
    }
    let (mut reads_recovered, mut writes_ok) = (0, 0);
    while let Some(done) = tasks.join_next().await {
        match done.expect("no panic") {
            (Method::GET, Some(200)) => reads_recovered += 1,
            (Method::POST, Some(200)) => writes_ok += 1,
            _ => {}
        }
    }
    Row {
        name,
        applied_twice: server.applied_twice(),
        reads_recovered,
        writes_ok,
        attempts: server.total_attempts(),
    }
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>()
}

fn reqwest_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(PER_ATTEMPT)
        .build()
        .expect("a plain http client")
}

/// reqwest with reqwest-retry's transient-error middleware, 3 retries.
fn reqwest_retry() -> reqwest_middleware::ClientWithMiddleware {
    let retry_policy =
        reqwest_retry::policies::ExponentialBackoff::builder().build_with_max_retries(3);
    reqwest_middleware::ClientBuilder::new(reqwest_client())
        .with(reqwest_retry::RetryTransientMiddleware::new_with_policy(
            retry_policy,
        ))
        .build()
}

/// The crate's defaults but for the retry budget: 5 of 6 first attempts fail here, and the
/// default budget (a 10 retries/s floor plus 20 % of requests) would rightly throttle such a
/// burst. A 100/s floor lets every retry the table allows through.
fn policy() -> RetryPolicyBuilder {
    RetryPolicy::builder().lock_free_budget(Duration::from_secs(10), 100, 0.2)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut rows = others_rows().await;
    rows.extend(our_rows().await?);
    print_fault_table(&rows);
    let cut_rows = cut_rows().await?;
    print_cut_table(&cut_rows);
    suppressed::show_suppressed_error().await
}

/// The stacks people use today, each against a fresh fault server.
async fn others_rows() -> Vec<Row> {
    let mut rows = Vec::new();
    let bare = ServiceBuilder::new().timeout(PER_ATTEMPT).service(client());
    rows.push(run("no retry", tower_sender(bare)).await);

    let typical = ServiceBuilder::new()
        .retry(TypicalPolicy { left: 3 })
        .timeout(PER_ATTEMPT)
        .service(client());
    rows.push(run("tower::retry, typical policy", tower_sender(typical)).await);

    // reqwest 0.13's own default retries, nothing added.
    let plain = reqwest_middleware::ClientBuilder::new(reqwest_client()).build();
    rows.push(run("reqwest 0.13, built-in default", reqwest_sender(plain)).await);
    rows.push(
        run(
            "reqwest + reqwest-retry 0.9",
            reqwest_sender(reqwest_retry()),
        )
        .await,
    );
    rows
}

/// This crate's stacks, then the two hedging rows and the keys end to end.
async fn our_rows() -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let mut rows = Vec::new();
    let ours = ServiceBuilder::new()
        .layer(policy().build()?)
        .timeout(PER_ATTEMPT)
        .service(client());
    rows.push(run("tower-retry-safety (tower layer)", tower_sender(ours)).await);

    {
        // A policy of its own: clones share one retry budget, and this row should not start
        // with the budget the row above spent.
        let policy = policy().build()?;
        let ours = reqwest_middleware::ClientBuilder::new(reqwest_client())
            .with(tower_retry_safety::RetrySafetyMiddleware::new(policy))
            .build();
        rows.push(
            run(
                "tower-retry-safety (reqwest-middleware)",
                reqwest_sender(ours),
            )
            .await,
        );
    }
    rows.extend(hedging_rows().await?);

    // Keys end to end: the client mints one per write and reuses it on every attempt; the
    // server's IdempotencyLayer sends the stored response of a write that already ran.
    let keyed = ServiceBuilder::new()
        .layer(policy().mint_idempotency_keys(true).build()?)
        .timeout(PER_ATTEMPT)
        .service(client());
    let keyed_server =
        FaultServer::start_with_keys(IdempotencyLayer::new(MemoryStore::new())).await;
    rows.push(
        run_against(
            "tower-retry-safety + idempotency keys",
            tower_sender(keyed),
            keyed_server,
        )
        .await,
    );
    Ok(rows)
}

/// Hedging: tower's `hedge` at p90 of 20 ms (its histogram pre-filled, as after a warm-up),
/// and this crate's at a fixed 20 ms with up to 50 % extra load.
async fn hedging_rows() -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let tower_hedge = tower::hedge::Hedge::new_with_mock_latencies(
        ServiceBuilder::new().timeout(PER_ATTEMPT).service(client()),
        HedgeAll,
        10,
        0.9,
        Duration::from_secs(60),
        &[20; 100],
    );
    // Not `Clone`: shared through a buffer.
    let tower_hedge = tower::buffer::Buffer::new(tower_hedge, 1024);
    let theirs = run("tower::hedge, typical policy", tower_sender(tower_hedge)).await;
    let hedged = ServiceBuilder::new()
        .layer(
            policy()
                .hedge(Hedge::fixed(Duration::from_millis(20)).max_extra_load(0.5))
                .build()?,
        )
        .timeout(PER_ATTEMPT)
        .service(client());
    let ours = run("tower-retry-safety + hedging", tower_sender(hedged)).await;
    Ok(vec![theirs, ours])
}

fn print_fault_table(rows: &[Row]) {
    let total = OPS_PER_FAULT * Fault::ALL.len();
    println!(
        "{total} writes (POST) and {total} reads (GET); each op's first attempt gets one of: {}",
        Fault::ALL.map(Fault::name).join(", ")
    );
    println!(
        "\n{:<42} {:>20} {:>16} {:>17} {:>16}",
        "stack", "writes applied twice", "reads recovered", "writes answered", "server attempts"
    );
    for r in rows {
        println!(
            "{:<42} {:>20} {:>16} {:>17} {:>16}",
            r.name,
            format!("{} / {total}", r.applied_twice),
            format!("{} / {total}", r.reads_recovered),
            format!("{} / {total}", r.writes_ok),
            r.attempts,
        );
    }
    println!(
        "\nwrites applied twice  writes the server applied more than once (a repeated side effect)\n\
         reads recovered       reads that ended in a 200, after retries if any\n\
         writes answered       writes whose caller got a 200; the others got an error or the\n\
         {:22}failed response, each saying whether the write may have been applied\n\
         server attempts       requests that reached the server: {} operations, plus one per retry",
        "",
        2 * total
    );
}

/// Reads whose body is cut mid-way: the same stacks, and this crate with the body made part
/// of the attempt.
async fn cut_rows() -> Result<Vec<(&'static str, usize)>, Box<dyn std::error::Error>> {
    let mut cut_rows: Vec<(&str, usize)> = Vec::new();
    let typical = ServiceBuilder::new()
        .retry(TypicalPolicy { left: 3 })
        .timeout(PER_ATTEMPT)
        .service(client());
    cut_rows.push((
        "tower::retry, typical policy",
        cut_reads(tower_get(typical)).await,
    ));
    cut_rows.push((
        "reqwest + reqwest-retry 0.9",
        cut_reads(reqwest_get(reqwest_retry())).await,
    ));
    let ours = ServiceBuilder::new()
        .layer(policy().build()?)
        .layer(tower_retry_safety::resume::ReadWholeLayer::new())
        .service(client());
    cut_rows.push((
        "tower-retry-safety + ReadWholeLayer",
        cut_reads(tower_get(ours)).await,
    ));
    {
        let plain = reqwest::Client::new();
        let ours = reqwest_middleware::ClientBuilder::new(plain.clone())
            .with(tower_retry_safety::RetrySafetyMiddleware::new(
                policy().build()?,
            ))
            .with(tower_retry_safety::resume::ReadWholeMiddleware::new().resume_with(plain))
            .build();
        cut_rows.push((
            "tower-retry-safety + ReadWholeMiddleware",
            cut_reads(reqwest_get(ours)).await,
        ));
    }
    Ok(cut_rows)
}

fn print_cut_table(cut_rows: &[(&str, usize)]) {
    let cut_total = CUT_OPS_PER_SIZE; // half of the 2 × CUT_OPS_PER_SIZE GETs are cut
    println!(
        "\nreads whose body is cut mid-way: {} GETs (16 KiB and 1 MiB), the first response of \
         {cut_total} cut right after the head or half-way",
        2 * CUT_OPS_PER_SIZE
    );
    println!("\n{:<42} {:>20}", "stack", "cut reads recovered");
    for (name, recovered) in cut_rows {
        println!("{:<42} {:>20}", name, format!("{recovered} / {cut_total}"));
    }
}
