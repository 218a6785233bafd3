#![allow(dead_code)]
pub mod cut_server;
#[allow(unused_imports)]
pub use retry_safety_testing::fault_server;
#[allow(unused_imports)]
pub use retry_safety_testing::fleet;
#[allow(unused_imports)]
pub use retry_safety_testing::logs;
pub mod raw_server;
pub mod read_whole;
#[allow(unused_imports)]
pub use retry_safety_testing::redis;
#[allow(unused_imports)]
pub use retry_safety_testing::runtime_server;
pub mod script;
pub mod soak;
#[allow(unused_imports)]
pub use retry_safety_testing::spans;
pub mod trickle;
