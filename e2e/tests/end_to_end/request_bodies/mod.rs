//! Request bodies through the proxy of `cargo run --example proxy`: streamed bodies forwarded
//! and replayed, to an upstream behind the server's `IdempotencyLayer`.

mod replay_proxy;
