//! The server's `IdempotencyLayer`: what it stores, frees and refuses, its edge cases and
//! outcomes through real sockets, minted keys, `RequestKey`, and its runtime warning.

#[path = "../support/mod.rs"]
mod support;

mod edge_cases;
mod in_process;
mod minted_keys;
mod outcomes;
mod request_key;
mod runtime_warning;
