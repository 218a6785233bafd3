//! Request bodies kept for a resend: the replay buffer, its edge cases, trailers, and a proxy
//! forwarding streamed bodies.

#[allow(dead_code)]
#[path = "../../examples/proxy.rs"]
mod proxy;

mod empty_bodies_are_retried;
mod replay_edge_bodies;
mod replay_proxy;
mod replay_reader;
mod replay_trailers;
mod replays_after_the_attempt_failed;
mod replays_continue_the_callers_body;
mod replays_match_the_model;
mod replays_refused_and_reported;
mod what_is_recorded_and_freed;
