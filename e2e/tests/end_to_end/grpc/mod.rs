//! gRPC over tonic with the server's `IdempotencyLayer` in front of a tonic server: its keyed
//! answers to the client layer on a real `Channel`, host-scoped key trust, and the layer's
//! answers as gRPC statuses.

mod hosts_keyed_writes;
mod keyed_server_answers;
mod server_layer;
