//! Whether a request may be sent again: the request verdict (methods, routes, hosts, markers,
//! keys and their trust), the spellings of a host or path a rule must hold for, the response
//! verdict, the decision table over a scripted inner service, and its properties.

mod bodies_replayed_or_sent_once;
mod client_side_keys;
mod decision_table;
mod host_and_path_rule_escapes;
mod lenient_spellings;
mod properties;
mod request_verdict;
mod response_class;
mod response_hook;
mod route_spellings;
mod scripted_layer;
mod stacking_cancelling_and_readiness;
mod the_error_a_caller_sees;
mod waits_budget_and_deadline;
