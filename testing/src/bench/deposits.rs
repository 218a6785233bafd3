//! The cost of a budget deposit alone.

use std::time::Instant;

use tower::retry::budget::Budget;

/// Nanoseconds per deposit over `n` deposits in a row.
pub fn ns_per_deposit(budget: &dyn Budget, n: u32) -> f64 {
    let start = Instant::now();
    for _ in 0..n {
        std::hint::black_box(budget).deposit();
    }
    start.elapsed().as_nanos() as f64 / f64::from(n)
}
