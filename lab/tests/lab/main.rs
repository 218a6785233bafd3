//! The fault lab: the proxy's counts against real clients on loopback, how it
//! tells operations apart, its exit status, and the key conformance check against
//! tower-idempotency-keys' layer and against servers that break its rules.

use retry_safety_testing as support;
use retry_safety_testing::pg;

mod command_line;
mod counting_upstream;
mod forwarded_headers;
mod goaway_faults;
mod h2_serving;
mod hedged_reads;
mod keys_broken_servers;
mod keys_conformance;
mod keys_over_shared_stores;
mod keys_with_credentials;
mod op_identity;
mod other_clients;
mod pipelined_requests;
mod proxy_counts;
mod raw_h2_client;
mod raw_upstream;
mod resends_in_disguise;
mod server_dialects;
mod stacks;
mod unanswered_writes;
mod verdicts;
