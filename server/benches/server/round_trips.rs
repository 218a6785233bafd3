//! A TCP proxy between a pool and PostgreSQL that counts round trips: a burst of bytes from
//! the client after the server last spoke is one. Wall time on a shared machine moves from run
//! to run; this count does not.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// sqlx's ping (a `Sync` alone): the pool's check of a connection it hands out and of one
/// given back.
const PING: [u8; 5] = [b'S', 0, 0, 0, 4];

#[derive(Default)]
pub(crate) struct Tally {
    round_trips: AtomicU64,
    pings: AtomicU64,
}

impl Tally {
    /// Round trips so far, and how many of them were the pool's pings.
    pub(crate) fn read(&self) -> (u64, u64) {
        (
            self.round_trips.load(Ordering::Relaxed),
            self.pings.load(Ordering::Relaxed),
        )
    }
}

/// Listens on a free loopback port and forwards each connection to `upstream`; returns the
/// port and the tally of every connection through it.
pub(crate) async fn start(upstream: String) -> (u16, Arc<Tally>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let tally = Arc::new(Tally::default());
    let shared = tally.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = TcpStream::connect(&upstream).await.expect("PostgreSQL");
            let (tally, server_spoke) = (shared.clone(), Arc::new(AtomicBool::new(true)));
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (mut from_client, mut to_client) = client.into_split();
            let (mut from_server, mut to_server) = server.into_split();
            let spoke = server_spoke.clone();
            tokio::spawn(async move {
                let mut buf = vec![0; 64 * 1024];
                while let Ok(n @ 1..) = from_client.read(&mut buf).await {
                    if spoke.swap(false, Ordering::AcqRel) {
                        tally.round_trips.fetch_add(1, Ordering::Relaxed);
                        if buf[..n] == PING {
                            tally.pings.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    if to_server.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                let _ = to_server.shutdown().await;
            });
            tokio::spawn(async move {
                let mut buf = vec![0; 64 * 1024];
                while let Ok(n @ 1..) = from_server.read(&mut buf).await {
                    server_spoke.store(true, Ordering::Release);
                    if to_client.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                let _ = to_client.shutdown().await;
            });
        }
    });
    (port, tally)
}
