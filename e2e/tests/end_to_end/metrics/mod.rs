//! OpenTelemetry metrics against a server that honours keys: the client's instruments beside
//! the `RetryReport`s of a fault mix, and the server layer's against the answers it gave.

mod fault_mix_matches_reports;
mod server_layer_counts;
