//! The retry budget's ledger — `src/budget/ledger.rs`, compiled here unchanged, with loom's
//! atomics through `src/budget/sync.rs` — under loom's model checker (`models.rs`).
//!
//! ```sh
//! cd loom && RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release
//! ```
//!
//! A crate of its own because `--cfg loom` reaches every dependency, and under it tokio drops
//! its `net` module, which the main crate's dev-dependencies (hyper-util, reqwest) need.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), allow(dead_code))]

#[path = "../../src/budget/ledger.rs"]
mod ledger;
#[path = "../../src/budget/sync.rs"]
mod sync;
#[path = "../../src/budget/word.rs"]
mod word;

#[cfg(all(test, loom))]
mod models;
