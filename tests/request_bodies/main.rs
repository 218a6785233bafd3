//! Request bodies kept for a resend: the replay buffer, its edge cases, trailers, and a proxy
//! forwarding streamed bodies.

mod empty_bodies_are_retried;
mod replay_edge_bodies;
mod replay_reader;
mod replay_trailers;
mod replays_after_the_attempt_failed;
mod replays_continue_the_callers_body;
mod replays_match_the_model;
mod replays_refused_and_reported;
mod what_is_recorded_and_freed;
