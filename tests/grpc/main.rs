//! gRPC over tonic: the client layer on a real `Channel`, the server's `IdempotencyLayer` in
//! front of a tonic server, and servers that misbehave.

mod client_calls;
mod deadlines_on_calls;
mod host_metadata;
mod hosts;
mod unreachable_origins;
mod with_origin;

// The adversarial review of the gRPC support (issue 24): servers that misbehave.
mod descriptor_verdicts;
mod reads_recovered;
mod statuses_and_plain_http;
mod writes_sent_once;

// The adversarial review of the host-unknown and may-have-been-applied change.
mod may_have_been_applied_over_grpc;
mod unknown_host_verdicts;
mod unknown_hosts_on_a_socket;
