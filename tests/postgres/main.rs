//! `PostgresStore` and atomic mode on real PostgreSQL: atomic and lease modes, transactions a
//! handler ends by hand, a crash of the server process, and PostgreSQL restarted mid-request.

use retry_safety_testing::pg;

mod atomic_and_lease_modes;
mod atomic_mode;
mod crash;
mod hand_ended_transactions;
mod restart;
