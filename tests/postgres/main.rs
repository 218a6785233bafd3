//! `PostgresStore` and atomic mode on real PostgreSQL: atomic and lease modes, transactions a
//! handler ends by hand, a crash of the server process, and PostgreSQL restarted mid-request.

#[cfg(feature = "postgres")]
#[path = "../pg/mod.rs"]
mod pg;

mod atomic_and_lease_modes;
mod atomic_mode;
mod crash;
mod hand_ended_transactions;
mod restart;
