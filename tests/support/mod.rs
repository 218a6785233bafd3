#![allow(dead_code)]
pub mod cut_server;
pub mod fault_server;
#[cfg(feature = "redis")]
pub mod fleet;
pub mod logs;
pub mod raw_server;
pub mod read_whole;
#[cfg(feature = "redis")]
pub mod redis;
pub mod runtime_server;
pub mod script;
pub mod soak;
pub mod spans;
pub mod trickle;
