//! An HTTP/1.1 upstream on raw TCP that does exactly what a test's plan says: close without
//! answering, answer too long, hold an answer, or answer a given status and headers.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;

/// A guard against a hang, never a measure: every wait ends long before it.
pub const GUARD: Duration = Duration::from_secs(60);

/// Requests whose held answers can be released one by one; later ones share the last signal.
const PLANNED: usize = 16;

/// What the raw upstream does once it has read (and counted) a request.
#[derive(Clone, Copy, Debug)]
pub enum Then {
    /// Closes the connection without a byte of answer.
    Close,
    /// Answers a 200 whose body is 4 KiB (over the proxy's 1 KiB limit in these tests).
    Oversized,
    /// Waits for [`RawUpstream::release`] of its request, then answers a 200, marked as a stored response
    /// when `stored`.
    HeldThenOk { stored: bool },
    /// Answers at once with this status line's tail and header lines (`"409 Conflict"`,
    /// `"200 OK\r\nx-replayed: true"`) and a `{}` body.
    Reply(&'static str),
    /// Answers with these bytes as they are (a whole response: status line, headers, body).
    Verbatim(&'static str),
}

/// An HTTP/1.1 upstream written on raw TCP, one request per connection: it counts each
/// request it read whole, then does the plan's next step (the last one repeats).
pub struct RawUpstream {
    addr: SocketAddr,
    received: watch::Receiver<u32>,
    /// Each request's head as read, lowercased, in the order received.
    heads: Arc<Mutex<Vec<String>>>,
    /// One per request, by the order received: a held answer waits for its own.
    releases: Arc<Vec<Notify>>,
    /// Dropping it aborts the accept loop, whose set aborts every connection.
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RawUpstream {
    pub async fn start(plan: Vec<Then>) -> RawUpstream {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (count, received) = watch::channel(0u32);
        let heads: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen = heads.clone();
        let releases: Arc<Vec<Notify>> = Arc::new((0..PLANNED).map(|_| Notify::new()).collect());
        let held = releases.clone();
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            let count = Arc::new(count);
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (count, held, plan) = (count.clone(), held.clone(), plan.clone());
                let seen = seen.clone();
                connections.spawn(async move {
                    let mut stream = stream;
                    let Some(head) = read_request(&mut stream).await else {
                        return;
                    };
                    seen.lock().expect("not poisoned").push(head);
                    let mut n = 0;
                    count.send_modify(|c| {
                        n = *c;
                        *c += 1;
                    });
                    let then = plan[(n as usize).min(plan.len() - 1)];
                    answer(&mut stream, then, &held[(n as usize).min(PLANNED - 1)]).await;
                });
            }
        });
        RawUpstream {
            addr,
            received,
            heads,
            releases,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The heads of the requests read so far, lowercased.
    pub fn heads(&self) -> Vec<String> {
        self.heads.lock().expect("not poisoned").clone()
    }

    /// Requests read whole so far.
    pub fn received(&self) -> u32 {
        *self.received.borrow()
    }

    pub async fn wait_received(&self, n: u32) {
        let mut rx = self.received.clone();
        tokio::time::timeout(GUARD, rx.wait_for(|c| *c >= n))
            .await
            .expect("the upstream receives the requests")
            .expect("the upstream runs");
    }

    /// Lets the held answer to the `n`th request received (from 0) go, now or when it comes.
    pub fn release(&self, n: usize) {
        self.releases[n].notify_one();
    }
}

/// Reads a request's head and its `content-length` body; the head, lowercased, or `None` if
/// the connection ended first.
async fn read_request(stream: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    Some(head)
}

async fn answer(stream: &mut TcpStream, then: Then, held: &Notify) {
    let response = match then {
        Then::Close => return,
        Then::Oversized => {
            let mut r =
                b"HTTP/1.1 200 OK\r\ncontent-length: 4096\r\nconnection: close\r\n\r\n".to_vec();
            r.extend_from_slice(&[b'x'; 4096]);
            r
        }
        Then::Reply(reply) => {
            format!("HTTP/1.1 {reply}\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}")
                .into_bytes()
        }
        Then::Verbatim(response) => response.as_bytes().to_vec(),
        Then::HeldThenOk { stored } => {
            held.notified().await;
            let marked = if stored {
                "idempotent-replayed: true\r\n"
            } else {
                ""
            };
            format!("HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n{marked}\r\n{{}}")
                .into_bytes()
        }
    };
    let _ = stream.write_all(&response).await;
    let _ = stream.shutdown().await;
}
