//! The policy owns the time: deadlines, per-attempt timeouts, request options, and what each
//! resend and hedge carries.

#[path = "../support/mod.rs"]
mod support;

mod deadlines_across_hops;
mod deadlines_and_timeouts;
mod no_resend_after_the_deadline;
mod resend_heads_and_deadlines;
