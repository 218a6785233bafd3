//! Hedging: on paused time, over HTTP/1.1 and HTTP/2 on loopback, its properties, and the
//! attacks on safe hedging and its spans.

mod h2_losers;
mod hedge_properties;
mod hedges_behind_a_concurrency_limit;
mod loopback;
mod paused_time;

// The adversarial review of safe hedging and the per-attempt spans (issue 25).
#[cfg(feature = "reqwest-middleware")]
mod hedge_limits_and_settings;
#[cfg(feature = "reqwest-middleware")]
mod hedge_spans;
#[cfg(feature = "reqwest-middleware")]
mod held_and_unready_hedges;
#[cfg(feature = "reqwest-middleware")]
mod learned_delay_per_host;
#[cfg(feature = "reqwest-middleware")]
mod losers_on_loopback;
#[cfg(feature = "reqwest-middleware")]
mod writes_never_hedged_twice;
