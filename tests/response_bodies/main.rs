//! Response bodies: read whole, resumed with `Range`, cut mid-way, classified by their bytes,
//! and the attempt's clock while a body is read.

#[cfg(feature = "reqwest-middleware")]
mod attempt_clock;
mod duration_max_attempt_timeout;
mod peek_body_frames_reach_the_caller;
mod peek_body_reads_are_bounded;
#[cfg(feature = "reqwest-middleware")]
mod peek_body_reqwest_middleware;
mod peek_body_support;
mod peek_body_verdicts_never_repeat_a_write;
#[cfg(feature = "reqwest-middleware")]
mod range_resume_attacks;
mod read_whole;
#[cfg(feature = "reqwest-middleware")]
mod read_whole_reqwest;
mod response_body_hook;
mod resume_properties;
mod resume_range;
