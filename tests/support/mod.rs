#![allow(dead_code)]
pub mod fault_server;
pub mod logs;
pub mod script;
