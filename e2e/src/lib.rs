//! The labs the end-to-end examples run and their tests assert (unpublished): the deadline
//! chain of `cargo run --example deadlines` and the streaming proxy of `cargo run --example
//! proxy`. The end-to-end tests, the ones that need the client, the server and the lab
//! together, are this package's `tests/end_to_end/`.

pub mod deadline_chain;
pub mod loopback;
pub mod proxy;

// The repository's README shows the client and the server together: its examples compile and
// run here, where both are dependencies.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;
