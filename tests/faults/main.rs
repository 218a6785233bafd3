//! Faults end to end: a chaos soak, a GOAWAY storm, HTTP/2 stream errors, errors in place of
//! sending, and hyper-util's client under the layer.

mod chaos;
mod end_to_end;
mod goaway_storm;
mod h2_stream_errors;
mod pre_send_errors;
