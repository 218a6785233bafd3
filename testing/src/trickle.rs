//! A response body that trickles: for the deadline across body resumes and a per-attempt
//! timeout of `Duration::MAX` while a body is read whole.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

/// A body that yields 10-byte chunks of a 100-byte representation from `from`, one every
/// 100 ms, and fails after three of them.
pub struct Trickle {
    pub next: usize,
    pub left: u32,
    pub sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl http_body::Body for Trickle {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        use std::task::Poll;
        if self.next >= 100 {
            return Poll::Ready(None);
        }
        if self.left == 0 {
            return Poll::Ready(Some(Err("connection reset".into())));
        }
        std::task::ready!(self.sleep.as_mut().poll(cx));
        let at = Instant::now() + Duration::from_millis(100);
        self.sleep.as_mut().reset(at);
        self.left -= 1;
        let start = self.next;
        self.next += 10;
        let chunk: Vec<u8> = (start..start + 10).map(|i| i as u8).collect();
        Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from(chunk)))))
    }
}
