//! Whether an HTTP/1.1 client is still there to be answered. hyper notices a client that
//! closed its connection only when it reads, and it does not read while requests the client
//! pipelined wait in its buffer: an answer would then be counted as given to a client that
//! had gone. The proxy asks the socket itself before it counts an answer.

use std::io;
use std::net::TcpStream as StdTcpStream;
use std::sync::{Mutex, PoisonError};

use tokio::net::TcpStream;

use crate::ledger::Unconfirmed;

/// What a look at a client's socket says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Presence {
    /// It closed the connection (or the connection broke): an answer would never arrive.
    Gone,
    /// Open, and every byte it sent read: an answer given now reaches it.
    There,
    /// Bytes it sent (more pipelined requests) are not read yet, and a close behind them
    /// cannot be seen: whether an answer given now arrives is not known.
    Hidden,
}

/// A second handle on a client's socket (the same socket, not a new connection), used only
/// to peek. It lives as long as the connection's service: the socket closes when hyper and
/// this have both let it go.
#[derive(Debug)]
pub(super) struct ClientWatch {
    socket: StdTcpStream,
    /// 2xx answers given while the client was [`Presence::Hidden`]: a later look that finds
    /// it there confirms them (a client that has not closed had not closed then either).
    unconfirmed: Mutex<Vec<Unconfirmed>>,
}

impl ClientWatch {
    /// The stream for hyper and a watch on the same socket.
    pub(super) fn split(tcp: TcpStream) -> io::Result<(TcpStream, ClientWatch)> {
        let std = tcp.into_std()?;
        let socket = std.try_clone()?;
        let watch = ClientWatch {
            socket,
            unconfirmed: Mutex::default(),
        };
        Ok((TcpStream::from_std(std)?, watch))
    }

    /// Whether the client is still there to be answered.
    pub(super) fn presence(&self) -> Presence {
        let mut byte = [0u8; 1];
        // The socket is non-blocking (tokio made it so): a peek never waits.
        match self.socket.peek(&mut byte) {
            Ok(0) => Presence::Gone,
            Ok(_) => Presence::Hidden,
            Err(err) => match err.kind() {
                io::ErrorKind::WouldBlock => Presence::There,
                // The look did not happen: nothing is known.
                io::ErrorKind::Interrupted => Presence::Hidden,
                _ => Presence::Gone,
            },
        }
    }

    /// Keeps a 2xx given while the client was hidden, to confirm later.
    pub(super) fn given_unconfirmed(&self, answer: Unconfirmed) {
        self.list().push(answer);
    }

    /// The 2xx answers given while the client was hidden, for a look that found it there.
    pub(super) fn take_unconfirmed(&self) -> Vec<Unconfirmed> {
        std::mem::take(&mut *self.list())
    }

    fn list(&self) -> std::sync::MutexGuard<'_, Vec<Unconfirmed>> {
        // A list of operation numbers stays one whatever panicked while it was held.
        self.unconfirmed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
