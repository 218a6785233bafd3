//! The fault lab for gRPC: 120 unary writes and 120 unary reads to a real tonic server on
//! 127.0.0.1, each call's first attempt broken by one fault, through two clients on a tonic
//! `Channel`:
//!
//! - the status-code retry users write today: retry UNAVAILABLE, DEADLINE_EXCEEDED and
//!   UNKNOWN up to 3 times, each attempt under a timeout;
//! - this crate's layer on the same kind of `Channel`, the read marked by the proto's
//!   `idempotency_level = NO_SIDE_EFFECTS`.
//!
//! Every count printed is measured by the server's handler.
//!
//! ```text
//! cargo run --example grpc --features tonic
//! ```

use retry_safety_testing::grpc as grpc_lab;

use std::sync::Arc;
use std::time::Duration;

use grpc_lab::lab::ledger_client::LedgerClient;
use grpc_lab::lab::{CountRequest, Entry};
use grpc_lab::{channel, request, serve, Fault, Lab};
use tokio::sync::Semaphore;
use tonic::Code;
use tower::ServiceBuilder;
use tower_retry_safety::RetryPolicy;

const CALLS: usize = 120;
/// Each attempt's limit, in both clients; the slow fault answers well after it.
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(150);
const SLOW: Duration = Duration::from_millis(400);
/// Calls in flight at once.
const CONCURRENCY: usize = 16;

fn fault(i: usize) -> Fault {
    [
        Fault::UnavailableAfterApply,
        Fault::UnavailableBefore,
        Fault::SlowAfterApply(SLOW),
        Fault::ResourceExhaustedBefore,
    ][i % 4]
}

/// What one client did: writes the server applied twice, reads that ended OK, and the
/// attempts the server received.
struct Row {
    writes_twice: usize,
    writes_applied: usize,
    reads_ok: usize,
}

fn entry(id: &str) -> Entry {
    Entry {
        id: id.into(),
        payload: vec![0; 32],
    }
}

/// The loop users write: up to 3 retries on UNAVAILABLE, DEADLINE_EXCEEDED, UNKNOWN.
async fn status_code_retry<T, F, Fut>(mut call: F) -> Result<T, tonic::Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let mut retries = 0;
    loop {
        let result = match tokio::time::timeout(ATTEMPT_TIMEOUT, call()).await {
            Ok(result) => result,
            Err(_) => Err(tonic::Status::deadline_exceeded("attempt timed out")),
        };
        match result {
            Err(status)
                if retries < 3
                    && matches!(
                        status.code(),
                        Code::Unavailable | Code::DeadlineExceeded | Code::Unknown
                    ) =>
            {
                retries += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other => return other,
        }
    }
}

async fn run_baseline(lab: &Lab, addr: std::net::SocketAddr) -> Row {
    let client = LedgerClient::new(channel(addr).await);
    let limit = Arc::new(Semaphore::new(CONCURRENCY));
    let mut tasks = Vec::new();
    for i in 0..CALLS {
        let (client, limit) = (client.clone(), limit.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = limit
                .acquire()
                .await
                .expect("the semaphore is never closed");
            let (w, r) = (format!("base-w{i}"), format!("base-r{i}"));
            let write = status_code_retry(|| {
                let mut c = client.clone();
                let req = request(entry(&w), &w, Some(fault(i)));
                async move { c.append(req).await }
            })
            .await;
            let read = status_code_retry(|| {
                let mut c = client.clone();
                let req = request(CountRequest { id: r.clone() }, &r, Some(fault(i)));
                async move { c.count(req).await }
            })
            .await;
            (write.is_ok(), read.is_ok())
        }));
    }
    tally(lab, "base", tasks).await
}

async fn run_layer(lab: &Lab, addr: std::net::SocketAddr) -> Row {
    let policy = RetryPolicy::builder()
        .grpc_descriptors(&grpc_lab::descriptor_set())
        .attempt_timeout(ATTEMPT_TIMEOUT)
        .max_retries(3)
        .backoff(Duration::from_millis(10), Duration::from_millis(50))
        // The lab breaks every call's first attempt: a budget sized for production traffic
        // (a floor of 10 retries/s plus 20 % of calls) would rightly throttle it. The lab
        // measures the decision, not the budget.
        .no_budget()
        .build()
        .expect("the lab's policy is valid");
    let svc = ServiceBuilder::new()
        .map_err(tower_retry_safety::grpc::into_status)
        .layer(policy)
        .service(channel(addr).await);
    let client = LedgerClient::new(svc);
    let limit = Arc::new(Semaphore::new(CONCURRENCY));
    let mut tasks = Vec::new();
    for i in 0..CALLS {
        let (mut client, limit) = (client.clone(), limit.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = limit
                .acquire()
                .await
                .expect("the semaphore is never closed");
            let (w, r) = (format!("ours-w{i}"), format!("ours-r{i}"));
            let write = client.append(request(entry(&w), &w, Some(fault(i)))).await;
            let read = client
                .count(request(CountRequest { id: r.clone() }, &r, Some(fault(i))))
                .await;
            (write.is_ok(), read.is_ok())
        }));
    }
    tally(lab, "ours", tasks).await
}

async fn tally(lab: &Lab, prefix: &str, tasks: Vec<tokio::task::JoinHandle<(bool, bool)>>) -> Row {
    let mut reads_ok = 0;
    for task in tasks {
        let (_, read) = task.await.expect("a call task panicked");
        reads_ok += usize::from(read);
    }
    // Let slow handlers that were cut client-side finish applying before counting.
    tokio::time::sleep(SLOW + Duration::from_millis(100)).await;
    let mut writes_twice = 0;
    let mut writes_applied = 0;
    for i in 0..CALLS {
        let applied = lab.applied(&format!("{prefix}-w{i}"));
        writes_twice += usize::from(applied > 1);
        writes_applied += usize::from(applied > 0);
    }
    Row {
        writes_twice,
        writes_applied,
        reads_ok,
    }
}

#[tokio::main]
async fn main() {
    let (addr, lab) = serve().await;
    println!(
        "gRPC fault lab: {CALLS} unary writes (lab.v1.Ledger/Append) and {CALLS} reads \
         (Count, NO_SIDE_EFFECTS) to a tonic server on {addr}."
    );
    println!(
        "Each call's first attempt: UNAVAILABLE after the write was applied, UNAVAILABLE \
         before, slower than the {} ms attempt timeout after applying, RESOURCE_EXHAUSTED before.\n",
        ATTEMPT_TIMEOUT.as_millis()
    );
    let baseline = run_baseline(&lab, addr).await;
    let ours = run_layer(&lab, addr).await;
    println!(
        "{:<64} {:>20} {:>16} {:>16}",
        "stack", "writes applied twice", "writes applied", "reads recovered"
    );
    for (name, row) in [
        (
            "status-code retry (UNAVAILABLE, DEADLINE_EXCEEDED, UNKNOWN; 3x)",
            &baseline,
        ),
        ("tower-retry-safety on the Channel", &ours),
    ] {
        println!(
            "{:<64} {:>20} {:>16} {:>16}",
            name,
            format!("{} / {CALLS}", row.writes_twice),
            format!("{} / {CALLS}", row.writes_applied),
            format!("{} / {CALLS}", row.reads_ok),
        );
    }
    println!(
        "\nA write the layer did not repeat came back as the server's status or as an error whose \
         tonic::Status says it may have been applied (metadata retry-safety-may-have-been-applied)."
    );
}
