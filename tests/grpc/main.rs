//! gRPC over tonic: the client layer on a real `Channel`, the server's `IdempotencyLayer` in
//! front of a tonic server, and servers that misbehave.

#[path = "../support/grpc/mod.rs"]
mod grpc_lab;
use retry_safety_testing::pg;
#[path = "../support/mod.rs"]
mod support;

mod client_calls;
mod host_metadata;
mod hosts;
mod misbehaving_servers;
mod server_layer;
mod unknown_hosts_and_reads;
mod unreachable_origins;
mod with_origin;
