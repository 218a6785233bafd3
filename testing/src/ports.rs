//! Ports for servers a test starts as processes of their own, and may stop and start again on
//! the same port ([`free_port`]).
//!
//! Chosen below the kernel's ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`): a
//! port a test lets go while its server is down (an outage, a crash and restart) is never
//! handed to another listener that binds port 0, which every loopback server of every test
//! process beside it does. And picked at random, not in the kernel's order, so that two
//! processes asking at once rarely get the same one (a [`redis::Node`](crate::redis::Node)
//! checks that the process answering is its own either way).

use std::collections::BTreeSet;
use std::hash::{BuildHasher, RandomState};
use std::net::TcpListener;
use std::sync::Mutex;

/// How far below the ephemeral range ports are drawn from.
const SPAN: u16 = 12_000;
/// The lowest port drawn (well above the services a machine runs on fixed ports, 5432, 6379).
const FLOOR: u16 = 10_000;

/// A free port on loopback that no earlier call in this process returned (bound, then let go:
/// the server that takes it binds it next, and checks that it did).
///
/// Never the same port twice: a port let go by a node killed mid-test is still remembered by
/// what watched it — a Sentinel (which sends `REPLICAOF` to whatever answers there again, to
/// make the old primary a replica), a replica of it (which reconnects), a store on its fixed
/// address (which renews there) — and a node of another test started on it would be taken
/// over by them.
pub fn free_port() -> u16 {
    let Some((low, high)) = below_ephemeral() else {
        return kernel_port();
    };
    let random = RandomState::new();
    for attempt in 0..1_000u32 {
        let draw = random.hash_one((std::process::id(), attempt));
        let port = low + (draw % u64::from(high - low)) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() && first_use(port) {
            return port;
        }
    }
    kernel_port()
}

/// Notes that this process listens on `port` ([`free_port`], or a listener of its own it
/// holds); `false` if it did before.
pub fn first_use(port: u16) -> bool {
    static USED: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    USED.lock().unwrap_or_else(|e| e.into_inner()).insert(port)
}

/// `[low, high)`: up to [`SPAN`] ports below the ephemeral range; `None` where it cannot be
/// read or leaves no room.
fn below_ephemeral() -> Option<(u16, u16)> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let first: u16 = range.split_whitespace().next()?.parse().ok()?;
    let low = first.saturating_sub(SPAN).max(FLOOR);
    (first > low + 1_000).then_some((low, first))
}

/// The kernel's choice (port 0), for a machine whose ephemeral range leaves no room below it.
fn kernel_port() -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        if first_use(port) {
            return port;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ports are drawn below the ephemeral range where there is one, never twice.
    #[test]
    fn ports_are_below_the_ephemeral_range_and_never_repeat() {
        let ports: Vec<u16> = (0..200).map(|_| free_port()).collect();
        let distinct: BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len());
        if let Some((low, high)) = below_ephemeral() {
            assert!(ports.iter().all(|p| (low..high).contains(p)), "{ports:?}");
        }
    }
}
