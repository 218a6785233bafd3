//! The retry budget: under contention, against tower's `TpsBudget`, and against amplification
//! in an outage.

#[path = "../support/mod.rs"]
mod support;

mod against_tps_budget;
mod amplification;
mod stress;
