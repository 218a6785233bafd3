//! Deadlines that cross hops, measured: an SDK-style client calls A, whose handler calls B,
//! whose handler calls C, all on loopback, every hop behind this crate's layers. C is slow or
//! failing on a schedule. Four rows, each beside the same calls made directly to C:
//!
//! - **today**: no deadline on the wire; each hop has only its own timeouts and retries;
//! - **deadlines**: each hop hands the time left on (`send_deadline_to`), each server reads it
//!   (`DeadlineLayer`), and nested calls inherit it;
//! - **deadlines + one layer**: the same, and a nested call whose caller retries makes no
//!   resends of its own (`retries_when_caller_retries(0)`);
//! - **stainless-sdk**: the hops as in the deadlines row, the first caller a client
//!   that speaks like a Stainless-generated SDK (OpenAI's), with none of this crate: a read
//!   timeout per attempt in `x-stainless-read-timeout`, `x-stainless-retry-count` on its
//!   retries, its own backoff. The server reads those as they are sent.
//!
//! Counted: handlers (at any hop) started after the originating caller gave up (on that
//! attempt, for the SDK that gives up on each one), writes
//! applied twice at C, attempts that reached C, and the work done after the deadline.
//!
//! Run with `cargo run --example deadlines`.

use retry_safety_e2e::deadline_chain::{self as chain, Row, Tally};

#[tokio::main]
async fn main() -> Result<(), tower::BoxError> {
    let calls = std::env::var("DEADLINES_CALLS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(48);
    println!(
        "{calls} calls per row; the SDK waits {:?} for each\n",
        chain::SDK_DEADLINE
    );
    println!(
        "{:<24} {:>6} {:>9} {:>9} {:>10} {:>8} {:>8} {:>9}",
        "row", "ok", "late", "twice", "attempts", "direct", "ratio", "wasted"
    );
    let mut rows = Vec::new();
    for row in Row::ALL {
        let chained = chain::run(row, calls, false).await?;
        let direct = chain::run(row, calls, true).await?;
        print_row(row, &chained, &direct);
        rows.push((row, chained, direct));
    }
    println!();
    for (row, chained, direct) in rows {
        println!(
            "chain {}: started after the deadline {}, applied twice {}, attempts {}, direct {}",
            row.name(),
            chained.started_late,
            chained.applied_twice,
            chained.attempts_at_c,
            direct.attempts_at_c,
        );
    }
    Ok(())
}

fn print_row(row: Row, chained: &Tally, direct: &Tally) {
    println!(
        "{:<24} {:>6} {:>9} {:>9} {:>10} {:>8} {:>8.2} {:>7}ms",
        row.name(),
        chained.ok,
        chained.started_late,
        chained.applied_twice,
        chained.attempts_at_c,
        direct.attempts_at_c,
        chained.attempts_at_c as f64 / direct.attempts_at_c.max(1) as f64,
        chained.wasted.as_millis(),
    );
}
