//! The harnesses the workspace's packages share in their tests (unpublished): the Redis a
//! test uses (the machine's, or one of its own), a fleet of servers over Redis with its own
//! primaries, replicas and Sentinels, a PostgreSQL database of the test's own, the fault
//! server that counts side effects, a service served from a runtime of its own, captured
//! logs and spans, a counting allocator, and the benches' statistics.
#![allow(missing_docs, unreachable_pub)]

pub mod alloc;
pub mod bench;
pub mod fault_server;
pub mod fleet;
pub mod logs;
pub mod pg;
pub mod redis;
pub mod runtime_server;
pub mod spans;
