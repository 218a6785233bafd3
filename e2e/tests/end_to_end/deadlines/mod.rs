//! Deadlines that cross hops (issue 43): the server's half — a request whose caller has gone
//! is answered at once and nothing runs, a keyed one frees its key, bad deadline headers are
//! ignored or capped and the answer says which — and the chain lab of
//! `cargo run --example deadlines`, whose goals are asserted here; and issue 48's: a wait for
//! readiness counts against the deadline, a streamed body's nested calls inherit it, either
//! order of the deadline and idempotency layers frees a late key, and the deadlines real
//! clients send are read.

mod chain_lab;
mod conventions;
mod hostile_deadline_headers;
mod layer_order;
mod loopback;
mod nested_call_started_in_call;
mod readiness_waits;
mod repeated_deadline_headers;
mod server_layer;
mod streamed_bodies;
