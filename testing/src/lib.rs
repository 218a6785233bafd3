//! The harnesses the workspace's packages share in their tests (unpublished): the Redis a
//! test uses (the machine's, or one of its own), a fleet of servers over Redis with its own
//! primaries, replicas and Sentinels, and a PostgreSQL database of the test's own.
#![allow(missing_docs, unreachable_pub)]

pub mod alloc;
pub mod fleet;
pub mod pg;
pub mod redis;
