//! Deadlines that cross hops (issue 43): the server's half — a request whose caller has gone
//! is answered at once and nothing runs, a keyed one frees its key, bad deadline headers are
//! ignored or capped and the answer says which — and the chain lab of
//! `cargo run --example deadlines`, whose goals are asserted here.

#[path = "../support/mod.rs"]
mod support;

#[path = "../../examples/deadlines/chain.rs"]
#[allow(dead_code)]
mod chain;
#[path = "../../examples/deadlines/hop.rs"]
#[allow(dead_code)]
mod hop;

mod chain_lab;
mod server_layer;
