//! Hedging against a server that honours keys: keyed writes hedged by opt-in are applied once.

mod keyed_hedges;
