//! Request bodies kept for a resend: the replay buffer, its edge cases, trailers, and a proxy
//! forwarding streamed bodies.

#[allow(dead_code)]
#[path = "../../examples/proxy.rs"]
mod proxy;

mod replay_buffer;
mod replay_edge_cases;
mod replay_proxy;
mod replay_trailers;
