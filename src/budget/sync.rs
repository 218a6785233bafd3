//! The atomics of the ledger: loom's under `cfg(loom)`, so that its model checker explores
//! every interleaving of them, std's otherwise. Only `loom/` (the model check, a crate of its
//! own) sets `cfg(loom)`: under it tokio drops its `net` module, which this crate's
//! dev-dependencies need.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
