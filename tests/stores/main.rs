//! The stores behind `IdempotencyLayer`: one contract for every store, late renewals, and a
//! fleet sharing one Redis.

#[cfg(feature = "postgres")]
#[path = "../pg/mod.rs"]
mod pg;
#[path = "../support/mod.rs"]
mod support;

mod contract;
mod late_renewals;
mod redis_fleet;
