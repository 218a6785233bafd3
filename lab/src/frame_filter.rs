//! An HTTP/2 server connection's outgoing bytes, read frame by frame (RFC 9113 §4.1: a 9-byte
//! header, then the payload): the lab's own GOAWAY is put in at a frame boundary outside any
//! header block once its connection goes away, and after it the frames the client must not
//! see are left out:
//! h2's own GOAWAYs (their last-stream-id is every stream received, higher than ours, which a
//! client takes as a protocol error) and the frames of a silenced stream (its reset).
//!
//! h2 cannot send a GOAWAY with a chosen last-stream-id, so the frame is written beside it.
//! Bytes are copied into a buffer and written on flush (h2 flushes after every batch of
//! frames), at most one batch past [`HIGH_WATER`] not yet written, and none already written
//! kept: the filter keeps h2's backpressure.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::goaway::{GoAway, State};

const HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const PUSH_PROMISE: u8 = 0x5;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
/// The flag that ends a header block (on HEADERS, PUSH_PROMISE or CONTINUATION).
const END_HEADERS: u8 = 0x4;
/// Buffered bytes past which a write first waits for the socket.
const HIGH_WATER: usize = 64 * 1024;

/// A GOAWAY frame: last-stream-id, NO_ERROR, no debug data.
fn goaway_frame(last_stream_id: u32) -> [u8; HEADER_LEN + 8] {
    let mut frame = [0u8; HEADER_LEN + 8];
    frame[2] = 8; // payload length
    frame[3] = GOAWAY;
    frame[HEADER_LEN..HEADER_LEN + 4]
        .copy_from_slice(&(last_stream_id & 0x7fff_ffff).to_be_bytes());
    frame
}

/// Where the filter is in the outgoing frames.
#[derive(Debug, Default)]
struct Frames {
    /// The header of the frame being read, its first `head_len` bytes.
    head: [u8; HEADER_LEN],
    head_len: usize,
    /// Payload bytes of the current frame still to come, and whether they are sent.
    payload_left: usize,
    keep: bool,
    /// Inside a header block: a HEADERS (or PUSH_PROMISE) without END_HEADERS was read, and
    /// the CONTINUATION that ends it not yet. Nothing may come between its frames (RFC 9113
    /// §6.10: any other frame is a connection error to the client).
    in_header_block: bool,
    /// Whether the lab's GOAWAY was put in the output.
    went_away: bool,
}

impl Frames {
    /// Where a frame of the lab's own may go: between frames, and not inside a header block.
    fn at_boundary(&self) -> bool {
        self.head_len == 0 && self.payload_left == 0 && !self.in_header_block
    }

    /// Puts the GOAWAY in once one was decided, at a frame boundary.
    fn go_away_if_due(&mut self, state: &State, out: &mut Vec<u8>) {
        if self.went_away || !self.at_boundary() {
            return;
        }
        if let Some(last) = state.last_stream_id {
            out.extend_from_slice(&goaway_frame(last));
            self.went_away = true;
        }
    }

    /// Reads `bytes` written by h2 into `out`, less what the client must not see.
    fn feed(&mut self, mut bytes: &[u8], state: &State, out: &mut Vec<u8>) {
        while !bytes.is_empty() {
            if self.payload_left > 0 {
                let n = self.payload_left.min(bytes.len());
                if self.keep {
                    out.extend_from_slice(&bytes[..n]);
                }
                self.payload_left -= n;
                bytes = &bytes[n..];
                continue;
            }
            self.go_away_if_due(state, out);
            let n = (HEADER_LEN - self.head_len).min(bytes.len());
            self.head[self.head_len..self.head_len + n].copy_from_slice(&bytes[..n]);
            self.head_len += n;
            bytes = &bytes[n..];
            if self.head_len < HEADER_LEN {
                break;
            }
            let head = self.head;
            let length = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            // A header block is never dropped: it changes the client's HPACK table (and a
            // silenced stream never sends one: it is not answered).
            let header_block = matches!(head[3], HEADERS | PUSH_PROMISE | CONTINUATION);
            if header_block {
                self.in_header_block = head[4] & END_HEADERS == 0;
            }
            let dropped = (self.went_away && head[3] == GOAWAY)
                || (stream != 0 && !header_block && state.is_silenced(stream));
            self.keep = !dropped;
            if self.keep {
                out.extend_from_slice(&head);
            }
            self.head_len = 0;
            self.payload_left = length;
        }
        self.go_away_if_due(state, out);
    }
}

/// The connection's IO with its outgoing frames filtered; reads pass through.
#[derive(Debug)]
pub(crate) struct FrameFilter<T> {
    io: T,
    conn: Arc<GoAway>,
    frames: Frames,
    /// Bytes for the socket, `out[written..]` not yet written.
    out: Vec<u8>,
    written: usize,
}

impl<T> FrameFilter<T> {
    pub(crate) fn new(io: T, conn: Arc<GoAway>) -> Self {
        FrameFilter {
            io,
            conn,
            frames: Frames::default(),
            out: Vec::new(),
            written: 0,
        }
    }
}

impl<T: AsyncWrite + Unpin> FrameFilter<T> {
    /// Writes the buffered bytes to the socket.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.out.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.out[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.out.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }

    /// A GOAWAY decided while h2 had nothing to write still goes out with the next flush.
    fn go_away_if_due(&mut self) {
        let state = self.conn.state();
        self.frames.go_away_if_due(&state, &mut self.out);
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for FrameFilter<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for FrameFilter<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.out.len() - this.written >= HIGH_WATER {
            ready!(this.poll_drain(cx))?;
        }
        // What a partial drain wrote goes before more comes in (less than HIGH_WATER is
        // moved): a reader that never lets the buffer empty whole must not make it keep
        // everything the connection sends.
        if this.written > 0 {
            this.out.drain(..this.written);
            this.written = 0;
        }
        let state = this.conn.state();
        this.frames.feed(buf, &state, &mut this.out);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.go_away_if_due();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.go_away_if_due();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::super::goaway::Stream;
    use super::*;

    fn frame(kind: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = (payload.len() as u32).to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, 0];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// Feeds `bytes` in pieces of `step` bytes, as partial writes would.
    fn feed_in_steps(frames: &mut Frames, conn: &GoAway, bytes: &[u8], step: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for piece in bytes.chunks(step) {
            frames.feed(piece, &conn.state(), &mut out);
        }
        out
    }

    #[test]
    fn frames_pass_whole_until_a_goaway_is_decided() {
        let conn = GoAway::new();
        let mut bytes = frame(0x4, 0, &[0; 6]);
        bytes.extend(frame(0x1, 1, b"headers"));
        bytes.extend(frame(0x0, 1, b"data"));
        for step in [1, 5, 9, 10, bytes.len()] {
            let mut frames = Frames::default();
            assert_eq!(feed_in_steps(&mut frames, &conn, &bytes, step), bytes);
        }
    }

    #[test]
    fn the_goaway_goes_in_at_the_next_boundary_and_h2s_own_are_dropped_after() {
        for step in [1, 4, 9, 13, 100] {
            let conn = GoAway::new();
            let (one, three) = (Stream::new(conn.clone(), 1), Stream::new(conn.clone(), 3));
            assert!(one.admit());
            let mut frames = Frames::default();
            let data = frame(0x0, 1, b"0123456789");
            // Half a frame, then the GOAWAY is decided: it waits for the frame's end.
            let mut out = feed_in_steps(&mut frames, &conn, &data[..12], step);
            assert!(three.go_away_before_forwarding());
            let mut rest = data[12..].to_vec();
            rest.extend(frame(GOAWAY, 0, &[0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0]));
            rest.extend(frame(0x3, 3, &[0, 0, 0, 8]));
            rest.extend(frame(0x6, 0, &[0; 8]));
            out.extend(feed_in_steps(&mut frames, &conn, &rest, step));
            let mut expected = data.clone();
            expected.extend(goaway_frame(1));
            // h2's GOAWAY and the silenced stream's reset are left out; the PING is not.
            expected.extend(frame(0x6, 0, &[0; 8]));
            assert_eq!(out, expected, "step {step}");
        }
    }

    /// Found by review of the GOAWAY faults: the GOAWAY went in between a HEADERS frame and
    /// its CONTINUATION, which a client takes as a connection error (RFC 9113 §6.10).
    #[test]
    fn the_goaway_waits_for_the_end_of_a_header_block() {
        for step in [1, 9, 12, 100] {
            let conn = GoAway::new();
            let one = Stream::new(conn.clone(), 1);
            assert!(one.admit());
            let mut frames = Frames::default();
            let headers = frame(HEADERS, 1, b"part");
            let mut out = feed_in_steps(&mut frames, &conn, &headers, step);
            assert!(Stream::new(conn.clone(), 3).go_away_before_forwarding());
            let mut rest = frame(CONTINUATION, 1, b"more");
            rest[4] = 0;
            let mut last = frame(CONTINUATION, 1, b"end");
            last[4] = END_HEADERS;
            rest.extend(last);
            let data = frame(0x0, 1, b"body");
            rest.extend(data);
            out.extend(feed_in_steps(&mut frames, &conn, &rest, step));
            let (block, data) = rest.split_at(rest.len() - 13);
            let mut expected = headers.clone();
            expected.extend_from_slice(block);
            expected.extend(goaway_frame(1));
            expected.extend_from_slice(data);
            assert_eq!(out, expected, "step {step}");
        }
    }

    /// A socket that takes `allowance` bytes, then is not ready until given more.
    struct Trickle {
        allowance: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let n = buf.len().min(self.allowance);
            if n == 0 {
                return Poll::Pending;
            }
            self.allowance -= n;
            Poll::Ready(Ok(n))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// A client that reads a little less than h2 writes between two flushes: the socket is
    /// never drained whole. The bytes already written must not stay in the buffer.
    ///
    /// Found by review of the GOAWAY faults: the buffer was emptied only when every byte in
    /// it had been written, so under a steady slow reader it kept everything the connection
    /// ever sent (here 10 MB).
    #[test]
    fn the_buffer_stays_bounded_under_a_reader_that_never_catches_up() {
        let mut filter = FrameFilter::new(Trickle { allowance: 0 }, GoAway::new());
        let frame = frame(0x0, 1, &[7; 10_000 - HEADER_LEN]);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut largest = 0;
        for _ in 0..1000 {
            // The socket takes 10 bytes less than a frame per round.
            filter.io.allowance += frame.len() - 10;
            if let Poll::Ready(written) = Pin::new(&mut filter).poll_write(&mut cx, &frame) {
                assert_eq!(written.ok(), Some(frame.len()));
            }
            let _ = Pin::new(&mut filter).poll_flush(&mut cx);
            largest = largest.max(filter.out.len());
        }
        assert!(
            largest <= HIGH_WATER + 2 * frame.len(),
            "{largest} bytes held"
        );
    }

    #[test]
    fn a_goaway_decided_while_idle_goes_out_with_the_next_flush() {
        let conn = GoAway::new();
        let mut frames = Frames::default();
        let mut out = Vec::new();
        assert!(Stream::new(conn.clone(), 1).go_away_before_forwarding());
        frames.go_away_if_due(&conn.state(), &mut out);
        frames.go_away_if_due(&conn.state(), &mut out);
        assert_eq!(out, goaway_frame(0));
    }
}
