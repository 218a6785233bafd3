//! A proxy that retries streamed request bodies, the proxy of `retry_safety_e2e::proxy`
//! (e2e/src/proxy.rs): a hyper server forwards each request, its `Incoming` body streamed as
//! it arrives, through this crate's layer to an upstream on loopback that meets faults on each
//! operation's first attempt and counts what it applies. Prints what each scenario did.
//!
//! Run: `cargo run --example proxy`

use retry_safety_e2e::proxy::{send, start_proxy, start_upstream, SCENARIOS};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let upstream = start_upstream().await?;
    let proxy = start_proxy(upstream.addr).await?;
    println!("client → proxy {proxy} → upstream {}\n", upstream.addr);
    println!(
        "{:<5} {:<14} {:<18} {:>8}  {:>6} {:>8} {:>7} {:>7}  stop / why",
        "", "path", "first attempt", "body", "status", "attempts", "applied", "corrupt"
    );
    for (method, path, fault, len) in SCENARIOS {
        let answer = send(proxy, method.clone(), path, fault, len).await?;
        let seen = upstream.seen(path);
        let why = answer.not_replayable.as_deref().unwrap_or("");
        let stored = if answer.stored { " (stored)" } else { "" };
        println!(
            "{:<5} {:<14} {:<18} {:>7}K  {:>6} {:>8} {:>7} {:>7}  {}{stored} {why}",
            method.as_str(),
            path,
            fault.name(),
            len / 1024,
            answer.status.as_u16(),
            seen.attempts,
            seen.applied,
            seen.corrupt,
            answer.stop,
        );
    }
    println!(
        "\nattempts and applied are counted by the upstream; corrupt counts applied bodies that \
         were not byte for byte what the client streamed."
    );
    Ok(())
}
