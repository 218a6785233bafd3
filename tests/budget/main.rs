//! The retry budget: under contention, against tower's `TpsBudget`, and against amplification
//! in an outage.

mod against_tps_budget;
mod amplification;
mod stress;
