//! The reqwest-middleware adapter against a server that honours keys: minted keys, and hedging.

mod keyed_hedge;
mod minted_keys;
