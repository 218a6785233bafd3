//! The client, the server and the lab together, over real sockets on loopback: the tests that
//! need more than one of the workspace's published packages, by the area of the client's
//! tests each belongs to (`tests/<area>/` at the root holds the client's own).

mod deadlines;
mod decisions;
mod grpc;
mod hedging;
mod metrics;
mod request_bodies;
mod reqwest;
mod response_bodies;
mod time_and_options;
