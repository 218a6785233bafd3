//! The policy owns the time: deadlines, per-attempt timeouts, request options, and what each
//! resend and hedge carries.

mod deadline_headers_per_attempt;
mod deadlines_across_hops;
mod deadlines_and_timeouts;
mod grpc_timeout_under_a_policy_deadline;
mod huge_zero_and_absolute_deadlines;
mod keyed_requests_resent_or_not;
mod no_resend_after_the_deadline;
mod reqwest_request_timeout_on_the_wire;
mod resends_copy_the_whole_head;
