//! Hedging against a server that honours keys: on loopback over HTTP/1.1 and HTTP/2, and
//! writes never hedged twice.

mod loopback;
mod writes_never_hedged_twice;
