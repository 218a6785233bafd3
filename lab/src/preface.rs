//! Which HTTP a client speaks, from its first bytes: an HTTP/2 client with prior knowledge
//! opens with the connection preface (RFC 9113 §3.4), an HTTP/1.1 request never does. The
//! bytes are peeked, not read: the server chosen reads them again.

use std::io;
use std::time::Duration;

use tokio::net::TcpStream;

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Peeks at a preface split across segments this many times, a millisecond apart; then the
/// bytes so far decide (`PRI ` opens no HTTP/1.1 request a server would serve).
const SPLIT_PREFACE_PEEKS: u32 = 1000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    Http1,
    Http2,
}

/// Waits for the client's first bytes (as long as it takes, as hyper does) and tells which
/// protocol they open. An error or end of stream before any byte: nothing to serve.
pub(crate) async fn sniff(stream: &TcpStream) -> io::Result<Protocol> {
    let mut buf = [0u8; PREFACE.len()];
    let mut n = 0;
    for _ in 0..SPLIT_PREFACE_PEEKS {
        n = stream.peek(&mut buf).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if buf[..n] != PREFACE[..n] {
            return Ok(Protocol::Http1);
        }
        if n == PREFACE.len() {
            return Ok(Protocol::Http2);
        }
        // Part of the preface: peeking again at once would spin on the same bytes.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(if n >= 4 {
        Protocol::Http2
    } else {
        Protocol::Http1
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    async fn sniffed(first: &'static [u8], then: &'static [u8]) -> io::Result<Protocol> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let client = tokio::spawn(async move {
            let mut c = TcpStream::connect(addr).await?;
            c.write_all(first).await?;
            c.flush().await?;
            // Likely a segment of its own (nothing depends on it).
            tokio::time::sleep(Duration::from_millis(20)).await;
            c.write_all(then).await?;
            io::Result::Ok(())
        });
        let (server, _) = listener.accept().await?;
        let protocol = sniff(&server).await;
        let _ = client.await;
        protocol
    }

    #[tokio::test]
    async fn tells_a_preface_from_a_request_even_when_split() {
        assert_eq!(
            sniffed(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"").await.ok(),
            Some(Protocol::Http2)
        );
        assert_eq!(
            sniffed(b"PRI * HT", b"TP/2.0\r\n\r\nSM\r\n\r\n").await.ok(),
            Some(Protocol::Http2)
        );
        assert_eq!(
            sniffed(b"POST / HTTP/1.1\r\n", b"").await.ok(),
            Some(Protocol::Http1)
        );
        assert_eq!(
            sniffed(b"P", b"UT / HTTP/1.1\r\n").await.ok(),
            Some(Protocol::Http1)
        );
    }
}
