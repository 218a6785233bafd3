//! Whether a request may be sent again: the request verdict (methods, routes, hosts, markers,
//! keys and their trust), the spellings of a host or path a rule must hold for, the response
//! verdict, the decision table over a scripted inner service, and its properties.

#[path = "../support/mod.rs"]
mod support;

mod decision_table;
mod host_and_path_rule_escapes;
mod key_trust;
mod lenient_spellings;
mod properties;
mod request_verdict;
mod response_class;
mod response_hook;
mod route_spellings;
mod stored_response;
