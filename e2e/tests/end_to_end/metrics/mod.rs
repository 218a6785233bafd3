//! OpenTelemetry metrics against a server that honours keys: stored responses counted by both
//! halves, and the server layer's instruments against the answers it gave.

mod server_layer_counts;
mod stored_responses_counted_by_each_half;
