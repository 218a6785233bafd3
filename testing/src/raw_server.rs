//! A scripted raw HTTP/1.1 server on 127.0.0.1 for the read-whole reviews: each request gets
//! the acts its script gives (write bytes, pause, close), so a test can cut a body anywhere,
//! and the server counts requests, range requests and writes.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the server does, in order, for one request.
#[derive(Clone, Debug)]
pub enum Act {
    /// Write these bytes (and flush).
    W(Vec<u8>),
    /// Pause.
    Pause(u64),
    /// Close the connection (a cut).
    Close,
}

/// A request as the server saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub head: String,
    pub range: Option<u64>,
}

type Script = Arc<dyn Fn(u32, &Seen) -> Vec<Act> + Send + Sync>;

#[derive(Default)]
pub struct RawCounts {
    pub requests: AtomicU32,
    pub ranges: AtomicU32,
    pub writes: AtomicU32,
    pub seen: Mutex<Vec<Seen>>,
}

pub struct Raw {
    addr: std::net::SocketAddr,
    counts: Arc<RawCounts>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Raw {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Raw {
    pub async fn start(script: impl Fn(u32, &Seen) -> Vec<Act> + Send + Sync + 'static) -> Raw {
        let script: Script = Arc::new(script);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let counts = Arc::new(RawCounts::default());
        let c = counts.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(serve_conn(stream, script.clone(), c.clone()));
            }
        });
        Raw { addr, counts, task }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
    pub fn requests(&self) -> u32 {
        self.counts.requests.load(Ordering::SeqCst)
    }
    pub fn ranges(&self) -> u32 {
        self.counts.ranges.load(Ordering::SeqCst)
    }
    pub fn writes(&self) -> u32 {
        self.counts.writes.load(Ordering::SeqCst)
    }
    /// The requests seen so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.counts.seen.lock().unwrap().clone()
    }
}

/// One connection: each request is read whole, counted, and answered with its script's acts,
/// until the client closes, a read or a write fails, or an act closes.
async fn serve_conn(mut stream: TcpStream, script: Script, counts: Arc<RawCounts>) {
    let mut buf = Vec::new();
    loop {
        let Some((head, lower)) = read_request(&mut stream, &mut buf).await else {
            return;
        };
        let (n, seen) = count(&counts, head, &lower);
        if !play(&mut stream, script(n, &seen)).await {
            return;
        }
    }
}

/// Reads a request's head and its body (`content-length` bytes) off `buf` and `stream`; the
/// head as sent and in lower case, or `None` when the connection ends first.
async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(String, String)> {
    // Read a head.
    let end = loop {
        if let Some(end) = find(buf, b"\r\n\r\n") {
            break end;
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_string();
    buf.drain(..end + 4);
    let lower = head.to_ascii_lowercase();
    let len: usize = lower
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < len {
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    buf.drain(..len);
    Some((head, lower))
}

/// Counts a request (and its range, and whether it is a write) and records it as seen; its
/// number (from 1) and what was seen.
fn count(counts: &RawCounts, head: String, lower: &str) -> (u32, Seen) {
    let method = head.split(' ').next().unwrap_or("").to_string();
    let range = lower
        .lines()
        .find_map(|l| l.strip_prefix("range: bytes="))
        .and_then(|v| v.trim().strip_suffix('-')?.parse().ok());
    let n = counts.requests.fetch_add(1, Ordering::SeqCst) + 1;
    if range.is_some() {
        counts.ranges.fetch_add(1, Ordering::SeqCst);
    }
    if method == "POST" || method == "PATCH" {
        counts.writes.fetch_add(1, Ordering::SeqCst);
    }
    let seen = Seen {
        method,
        head,
        range,
    };
    counts.seen.lock().unwrap().push(seen.clone());
    (n, seen)
}

/// Plays `acts` on `stream`; false when the connection is done (a write failed, or closed).
async fn play(stream: &mut TcpStream, acts: Vec<Act>) -> bool {
    for act in acts {
        match act {
            Act::W(bytes) => {
                if stream.write_all(&bytes).await.is_err() {
                    return false;
                }
                let _ = stream.flush().await;
            }
            Act::Pause(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            Act::Close => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let _ = stream.shutdown().await;
                return false;
            }
        }
    }
    true
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A response head with these header lines.
pub fn head(status: &str, lines: &[String]) -> Vec<u8> {
    let mut s = format!("HTTP/1.1 {status}\r\n");
    for l in lines {
        s.push_str(l);
        s.push_str("\r\n");
    }
    s.push_str("\r\n");
    s.into_bytes()
}

pub fn cl(n: usize) -> String {
    format!("content-length: {n}")
}

/// Representation `v`: bytes that differ between versions.
pub fn rep(len: usize, v: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i % 251) as u8).wrapping_add(v.wrapping_mul(97)))
        .collect()
}
