//! An HTTP/2 client on raw TCP that shows the frames a server sent, as they were on the wire:
//! what no client library reports (a GOAWAY's last-stream-id, a stream that got nothing).
//! It acknowledges SETTINGS and PINGs (a server's graceful shutdown waits for the PING's
//! answer); requests are encoded with HPACK's literal forms only.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::raw_upstream::GUARD;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;

/// One frame as received.
#[derive(Clone, Debug)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

impl Frame {
    /// A GOAWAY's last-stream-id and error code.
    pub fn goaway(&self) -> Option<(u32, u32)> {
        if self.kind != GOAWAY || self.payload.len() < 8 {
            return None;
        }
        let p = &self.payload;
        let last = u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff;
        let code = u32::from_be_bytes([p[4], p[5], p[6], p[7]]);
        Some((last, code))
    }
}

pub struct RawH2 {
    tcp: TcpStream,
    authority: String,
    /// Every frame received so far.
    pub frames: Vec<Frame>,
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A literal header field without indexing (RFC 7541 §6.2.2), no Huffman coding; `index`
/// names a static-table name, 0 a new name.
fn literal(block: &mut Vec<u8>, index: u8, name: &str, value: &str) {
    block.push(index);
    if index == 0 {
        block.push(name.len() as u8);
        block.extend_from_slice(name.as_bytes());
    }
    block.push(value.len() as u8);
    block.extend_from_slice(value.as_bytes());
}

impl RawH2 {
    /// Connects and sends the preface with empty SETTINGS.
    pub async fn connect(addr: SocketAddr) -> RawH2 {
        let tcp = TcpStream::connect(addr).await.expect("connects");
        RawH2::hello(tcp, addr).await
    }

    /// [`RawH2::connect`] with a small receive buffer: a client that stops reading soon
    /// backs up the server's writes.
    pub async fn connect_with_small_buffer(addr: SocketAddr) -> RawH2 {
        let socket = TcpSocket::new_v4().expect("a socket");
        socket.set_recv_buffer_size(4096).expect("a receive buffer");
        let tcp = socket.connect(addr).await.expect("connects");
        RawH2::hello(tcp, addr).await
    }

    async fn hello(mut tcp: TcpStream, addr: SocketAddr) -> RawH2 {
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        tcp.write_all(&hello).await.expect("preface sent");
        RawH2 {
            tcp,
            authority: addr.to_string(),
            frames: Vec::new(),
        }
    }

    /// Sends a POST of `body` to `path` on `stream` (odd, increasing), with extra headers.
    pub async fn post(&mut self, stream: u32, path: &str, headers: &[(&str, &str)], body: &[u8]) {
        self.open(stream, path, headers).await;
        self.finish(stream, body).await;
    }

    /// Sends a POST's headers on `stream`; its body is to come ([`RawH2::finish`]).
    pub async fn open(&mut self, stream: u32, path: &str, headers: &[(&str, &str)]) {
        // :method POST, :scheme http (static table 3 and 6).
        let mut block = vec![0x83, 0x86];
        literal(&mut block, 4, ":path", path);
        literal(&mut block, 1, ":authority", &self.authority);
        for (name, value) in headers {
            literal(&mut block, 0, name, value);
        }
        let bytes = frame(HEADERS, END_HEADERS, stream, &block);
        self.tcp.write_all(&bytes).await.expect("headers sent");
    }

    /// Sends the whole body of `stream`, ending it.
    pub async fn finish(&mut self, stream: u32, body: &[u8]) {
        let bytes = frame(DATA, END_STREAM, stream, body);
        self.tcp.write_all(&bytes).await.expect("body sent");
    }

    /// Reads one frame, answering SETTINGS and PINGs; `None` once the server closed.
    async fn next(&mut self) -> Option<Frame> {
        let mut head = [0u8; 9];
        self.tcp.read_exact(&mut head).await.ok()?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0u8; len];
        self.tcp.read_exact(&mut payload).await.ok()?;
        let f = Frame {
            kind: head[3],
            flags: head[4],
            stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
            payload,
        };
        let answer = match f.kind {
            SETTINGS if f.flags & ACK == 0 => Some(frame(SETTINGS, ACK, 0, &[])),
            PING if f.flags & ACK == 0 => Some(frame(PING, ACK, 0, &f.payload)),
            _ => None,
        };
        if let Some(answer) = answer {
            // The server may have closed its reading side already.
            let _ = self.tcp.write_all(&answer).await;
        }
        self.frames.push(f.clone());
        Some(f)
    }

    /// Reads until a frame `until` accepts arrives (`true`), or the server closed (`false`).
    pub async fn read_until(&mut self, until: impl Fn(&Frame) -> bool) -> bool {
        tokio::time::timeout(GUARD, async {
            while let Some(f) = self.next().await {
                if until(&f) {
                    return true;
                }
            }
            false
        })
        .await
        .expect("the server sends or closes")
    }

    /// Reads until the server closes the connection.
    pub async fn read_to_close(&mut self) {
        self.read_until(|_| false).await;
    }

    /// The frames received of one kind.
    pub fn of_kind(&self, kind: u8) -> Vec<&Frame> {
        self.frames.iter().filter(|f| f.kind == kind).collect()
    }

    /// The frames received on one stream, but WINDOW_UPDATEs.
    pub fn on_stream(&self, stream: u32) -> Vec<&Frame> {
        self.frames
            .iter()
            .filter(|f| f.stream == stream && f.kind != 0x8)
            .collect()
    }

    /// A stream's response body, if its last DATA frame ended the stream.
    pub fn body(&self, stream: u32) -> Option<Vec<u8>> {
        let data: Vec<&Frame> = self
            .frames
            .iter()
            .filter(|f| f.stream == stream && f.kind == DATA)
            .collect();
        let ended = data.last()?.flags & END_STREAM != 0;
        ended.then(|| data.iter().flat_map(|f| f.payload.clone()).collect())
    }
}
