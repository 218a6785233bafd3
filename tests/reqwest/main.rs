//! The reqwest-middleware adapter: retries, bodies, replay edge cases, hedging and bodies read
//! whole through `RetrySafetyMiddleware`.

mod hedging;
mod middleware;
mod read_whole;
mod replay_edge_cases;
mod reqwest_body;
