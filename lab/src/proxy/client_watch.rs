//! Whether an HTTP/1.1 client is still there to be answered. hyper notices a client that
//! closed its connection only when it reads, and it does not read while requests the client
//! pipelined wait in its buffer: an answer would then be counted as given to a client that
//! had gone. The proxy asks the socket itself before it counts an answer.

use std::io;
use std::net::TcpStream as StdTcpStream;

use tokio::net::TcpStream;

/// A second handle on a client's socket (the same socket, not a new connection), used only
/// to peek. It lives as long as the connection's service: the socket closes when hyper and
/// this have both let it go.
#[derive(Debug)]
pub(super) struct ClientWatch {
    socket: StdTcpStream,
}

impl ClientWatch {
    /// The stream for hyper and a watch on the same socket.
    pub(super) fn split(tcp: TcpStream) -> io::Result<(TcpStream, ClientWatch)> {
        let std = tcp.into_std()?;
        let socket = std.try_clone()?;
        Ok((TcpStream::from_std(std)?, ClientWatch { socket }))
    }

    /// Whether the client has closed the connection (or it broke). Bytes not yet read (more
    /// pipelined requests) hide a close behind them: then the client is taken to be there.
    pub(super) fn gone(&self) -> bool {
        let mut byte = [0u8; 1];
        // The socket is non-blocking (tokio made it so): a peek never waits.
        match self.socket.peek(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(err) => !matches!(
                err.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            ),
        }
    }
}
