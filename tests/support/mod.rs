#![allow(dead_code)]
pub mod cut_server;
pub mod fault_server;
#[allow(unused_imports)]
pub use retry_safety_testing::fleet;
pub mod logs;
pub mod raw_server;
pub mod read_whole;
#[allow(unused_imports)]
pub use retry_safety_testing::redis;
pub mod runtime_server;
pub mod script;
pub mod soak;
pub mod spans;
pub mod trickle;
