//! What a caller learns: attempt spans and events, `tracing` events, the outcome lookup,
//! and that nothing secret leaks into any of them.

mod applied_whatever_stopped_the_retries;
mod attempt_events;
mod attempt_spans;
mod no_secrets;
mod outcome_lookup;
mod reads_apply_nothing;
mod tracing_events;
