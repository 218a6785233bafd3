//! The server's `IdempotencyLayer`: what it stores, frees and refuses, its edge cases and
//! outcomes through real sockets, minted keys, `RequestKey`, and its runtime warning.

mod claims_kept_while_handlers_run;
mod in_process;
mod keyed_requests;
mod minted_keys;
mod outcomes;
mod outcomes_are_kept;
mod request_key;
mod response_bodies_and_buffers;
mod runtime_warning;
mod ttl_fingerprints_and_grpc_puts;
