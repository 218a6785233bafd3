//! The fault lab (`lab` feature): the proxy's counts against real clients on loopback, how it
//! tells operations apart, its exit status, and the key conformance check against this
//! crate's server layer and against servers that break its rules.

mod command_line;
mod keys_conformance;
mod op_identity;
mod proxy_counts;
