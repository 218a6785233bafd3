//! Hedging: on paused time, over HTTP/1.1 and HTTP/2 on loopback, its properties, and the
//! attacks on safe hedging and its spans.

#[path = "../support/mod.rs"]
mod support;

mod h2_losers;
mod hedge_properties;
mod hedges_behind_a_concurrency_limit;
mod loopback;
#[cfg(feature = "reqwest-middleware")]
mod never_twice_and_spans;
mod paused_time;
