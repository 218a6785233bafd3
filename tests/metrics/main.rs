//! OpenTelemetry metrics (feature `opentelemetry`): the client's instruments against the
//! `RetryReport`s of the same requests, and the server layer's against the answers it gave,
//! read back through the SDK's in-memory exporter. Every count is exact.

mod bounded_attributes;
mod fault_mix_matches_reports;
mod never_sent;
mod what_one_request_records;

/// What the instruments count beside what the server read (issue 41 items 7 and 8).
mod counted_as_it_happened;

// The harness, as the modules above that predate it name it (`super::Meters`).
use retry_safety_testing::meters::{client, request, Meters, Recorded};
