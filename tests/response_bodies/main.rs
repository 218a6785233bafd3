//! Response bodies: read whole, resumed with `Range`, cut mid-way, classified by their bytes,
//! and the attempt's clock while a body is read.

#[path = "../support/mod.rs"]
mod support;

#[cfg(feature = "reqwest-middleware")]
mod attempt_clock;
mod duration_max_attempt_timeout;
#[cfg(feature = "reqwest-middleware")]
mod range_resume_attacks;
mod read_whole;
#[cfg(feature = "reqwest-middleware")]
mod read_whole_keyed;
mod response_body_edge_cases;
mod response_body_hook;
mod resume_properties;
mod resume_range;
