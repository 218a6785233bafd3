//! The harnesses the workspace's packages share in their tests (unpublished): the fault
//! server that counts side effects, the cut and raw servers that break a response's body, a
//! scripted inner service, the read-whole stack, a service served from a runtime of its own,
//! captured logs and spans, a counting allocator and the benches' statistics; with the
//! `server` feature, the Redis a test uses (the machine's, or one of its own), a fleet of
//! servers over Redis with its own primaries, replicas and Sentinels, and a PostgreSQL
//! database of the test's own; with `grpc`, the gRPC lab service; with `metrics`, the
//! OpenTelemetry SDK's instruments read back.
#![allow(missing_docs, unreachable_pub)]

pub mod alloc;
pub mod bench;
pub mod cut_server;
pub mod fault_server;
pub mod hedging_stacks;
pub mod keys;
pub mod logs;
pub mod ports;
pub mod raw_server;
pub mod read_whole;
pub mod recording_service;
pub mod runtime_server;
pub mod script;
pub mod soak;
pub mod spans;
pub mod trickle;

#[cfg(feature = "server")]
pub mod fleet;
#[cfg(feature = "server")]
pub mod pg;
#[cfg(feature = "server")]
pub mod redis;

#[cfg(feature = "grpc")]
pub mod grpc;

#[cfg(feature = "metrics")]
pub mod meters;
