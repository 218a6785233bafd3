//! A claim's lease renewed while its handler runs: handlers in stretches, busy neighbours,
//! busy runtimes, and the ticker on its runtime. The tests time real work against real leases:
//! they take `SERIAL`, one at a time.

use std::sync::Mutex;

/// The renewal tests time real work against real leases: one at a time, in every module.
static SERIAL: Mutex<()> = Mutex::new(());

use retry_safety_testing::pg;

mod busy_neighbours;
mod busy_runtime_scenario;
mod busy_runtimes;
mod neighbours_lab;
mod outages;
mod ping_pong_tasks;
mod redis_renewals_from_short_neighbours;
mod slow_begin;
mod stretches;
mod tickers;
