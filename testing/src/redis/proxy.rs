//! A TCP proxy on loopback ([`Proxy`]) that can hold a replication stream back (both ways, or
//! only the primary's side), or send new connections to another port.

/// What the proxy holds back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hold {
    Nothing,
    /// What the upstream (a primary) sends; what the downstream (its replica) sends flows.
    Upstream,
    Both,
}

/// A TCP proxy on loopback between a replica and its primary that can hold the replication
/// stream back: paused, it forwards nothing either way (what it read stays in its buffers), so
/// the replica is really behind — unlike a replica stopped with SIGSTOP, whose socket buffer
/// holds the writes and which applies them before it is promoted. [`Proxy::hold_stream`] holds
/// only the primary's side: the replica's acknowledgements (`REPLCONF ACK`, every second) still
/// reach the primary, which sees it connected and not lagging while it receives nothing.
pub struct Proxy {
    pub port: u16,
    hold: tokio::sync::watch::Sender<Hold>,
    /// Where new connections go (an address that follows a promotion, as a managed service's
    /// name does).
    upstream: std::sync::Arc<std::sync::atomic::AtomicU16>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream_port: u16) -> Proxy {
        // Its own listener, held: no other process takes its port. One no earlier node or
        // proxy of this process had (see `free_port`).
        let (listener, port) = loop {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind loopback");
            let port = listener.local_addr().expect("addr").port();
            if crate::ports::first_use(port) {
                break (listener, port);
            }
        };
        let (hold, _) = tokio::sync::watch::channel(Hold::Nothing);
        let holds = hold.clone();
        let upstream = std::sync::Arc::new(std::sync::atomic::AtomicU16::new(upstream_port));
        let target = upstream.clone();
        let task = tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                let to = target.load(std::sync::atomic::Ordering::SeqCst);
                let Ok(up) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await else {
                    continue;
                };
                let (down_read, down_write) = down.into_split();
                let (up_read, up_write) = up.into_split();
                tokio::spawn(pump(up_read, down_write, holds.subscribe(), true));
                tokio::spawn(pump(down_read, up_write, holds.subscribe(), false));
            }
        });
        Proxy {
            port,
            hold,
            upstream,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Sends new connections to `port` from now on (connections made before stay where they
    /// are).
    pub fn point_to(&self, port: u16) {
        self.upstream
            .store(port, std::sync::atomic::Ordering::SeqCst);
    }

    /// Holds everything back from now on.
    pub fn pause(&self) {
        self.hold.send_replace(Hold::Both);
    }

    /// Holds back what the upstream (the primary) sends from now on, and only that: the
    /// replica gets no write, while its acknowledgements keep reaching the primary.
    pub fn hold_stream(&self) {
        self.hold.send_replace(Hold::Upstream);
    }

    pub fn resume(&self) {
        self.hold.send_replace(Hold::Nothing);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut hold: tokio::sync::watch::Receiver<Hold>,
    from_upstream: bool,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0; 64 * 1024];
    loop {
        let Ok(n) = from.read(&mut buf).await else {
            return;
        };
        if n == 0 {
            return;
        }
        // Read while held, or before: held until resumed, never forwarded meanwhile.
        let flows = |h: &Hold| match h {
            Hold::Nothing => true,
            Hold::Upstream => !from_upstream,
            Hold::Both => false,
        };
        if hold.wait_for(flows).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
