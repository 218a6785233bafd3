//! The reqwest-middleware adapter against a server that honours keys: minted keys, and hedging.

mod hedging;
mod minted_keys;
