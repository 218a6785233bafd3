//! The proxy's HTTP/2 connections, served with the `h2` crate itself (hyper's server cannot
//! send a GOAWAY with a chosen last-stream-id): the outgoing frames pass a [`FrameFilter`],
//! each stream's request goes to the proxy's handler as hyper would hand it, and once a fault
//! goes away the connection shuts down gracefully: the streams the GOAWAY covers and that
//! were forwarded get their answers (for at most the slow delay and 2 s), the others are
//! refused, then the connection closes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, RecvStream};
use http::header::{self, HeaderValue};
use http::{HeaderMap, Request, Response};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use super::frame_filter::FrameFilter;
use super::goaway::{GoAway, Stream};
use super::unanswered::Unanswered;

/// How long a closed connection's socket is read (and the bytes discarded) for the client to
/// close first: closing a socket with unread bytes sends a reset, which can make the client
/// lose the last frames (the GOAWAY among them).
const LINGER: Duration = Duration::from_secs(2);

/// Headers of one hop, not allowed in HTTP/2 (RFC 9113 §8.2.2): hyper's server strips them
/// from answers too (the proxy's `stopping` answer has `connection: close`).
const CONNECTION_SPECIFIC: [&str; 6] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
];

/// A request body read from h2, its flow-control capacity given back as it is read (the
/// client can then send more), as hyper's `Incoming` does.
#[derive(Debug)]
pub(crate) struct RecvBody {
    recv: RecvStream,
    data_done: bool,
}

impl Body for RecvBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let this = self.get_mut();
        if !this.data_done {
            match ready!(this.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(err)) => return Poll::Ready(Some(Err(err))),
                None => this.data_done = true,
            }
        }
        match ready!(this.recv.poll_trailers(cx)) {
            Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Ok(None) => Poll::Ready(None),
            Err(err) => Poll::Ready(Some(Err(err))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }
}

/// hyper's server defaults, so that clients see the settings they saw before.
fn builder() -> h2::server::Builder {
    let mut builder = h2::server::Builder::new();
    builder
        .initial_window_size(1024 * 1024)
        .initial_connection_window_size(1024 * 1024)
        .max_frame_size(16 * 1024)
        .max_concurrent_streams(200)
        .max_send_buffer_size(400 * 1024)
        .max_header_list_size(16 * 1024)
        .max_local_error_reset_streams(Some(1024));
    builder
}

/// Serves one HTTP/2 connection until the client closes it, it fails, or a fault's GOAWAY
/// has been followed through; then lingers. `grace` bounds the wait, after a GOAWAY, for the
/// streams it covers (the proxy's slow delay: an answer held for the slow fault still goes).
/// The handler ends a stream the GOAWAY leaves out ([`Stream::refused`]) without waiting
/// for more of its request: its client may never send the rest.
pub(crate) async fn serve<H, Fut>(mut tcp: TcpStream, handler: H, grace: Duration)
where
    H: Fn(Request<RecvBody>, Stream) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Response<Full<Bytes>>, Unanswered>> + Send + 'static,
{
    let goaway = GoAway::new();
    // Owned here: when the connection ends, its streams' handlers are dropped with it (a held
    // answer included), as hyper drops them.
    let mut streams = JoinSet::new();
    {
        let io = FrameFilter::new(&mut tcp, goaway.clone());
        let Ok(mut conn) = builder().handshake::<_, Bytes>(io).await else {
            return;
        };
        let gone = goaway.gone_away();
        tokio::pin!(gone);
        let gone_away = loop {
            tokio::select! {
                biased;
                () = &mut gone => break true,
                next = conn.accept() => match next {
                    Some(Ok((req, respond))) => {
                        streams.spawn(serve_stream(&handler, req, respond, &goaway));
                    }
                    // The client closed, or the connection failed (h2 has said why).
                    Some(Err(_)) | None => break false,
                },
            }
            while streams.try_join_next().is_some() {}
        };
        if gone_away {
            // h2's own GOAWAYs never reach the client (the filter drops them after the lab's);
            // h2 waits for the streams still open, then closes. Streams that arrive meanwhile
            // are above the GOAWAY's last-stream-id: refused.
            conn.graceful_shutdown();
            let closed = async {
                while let Some(next) = conn.accept().await {
                    if let Ok((req, respond)) = next {
                        streams.spawn(serve_stream(&handler, req, respond, &goaway));
                    }
                }
            };
            // A little past the grace: an answer held exactly the slow delay still goes out.
            // Saturating: a slow delay of `Duration::MAX` (forever) must not overflow.
            let _ = tokio::time::timeout(grace.saturating_add(LINGER), closed).await;
        }
    }
    // Past the grace, or the connection is over: what is left is dropped.
    streams.abort_all();
    linger(&mut tcp).await;
}

/// Closes the sending side, then reads until the client closes, at most [`LINGER`].
async fn linger(tcp: &mut TcpStream) {
    let _ = tcp.shutdown().await;
    let drained = async {
        let mut discard = [0u8; 4096];
        while matches!(tcp.read(&mut discard).await, Ok(n) if n > 0) {}
    };
    let _ = tokio::time::timeout(LINGER, drained).await;
}

/// One stream: the handler's answer, a reset, or (for a faulted stream) nothing at all.
fn serve_stream<H, Fut>(
    handler: &H,
    req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    goaway: &Arc<GoAway>,
) -> impl Future<Output = ()> + Send + 'static
where
    H: Fn(Request<RecvBody>, Stream) -> Fut,
    Fut: Future<Output = Result<Response<Full<Bytes>>, Unanswered>> + Send + 'static,
{
    let stream = Stream::new(goaway.clone(), u32::from(respond.stream_id()));
    let req = req.map(|recv| RecvBody {
        recv,
        data_done: false,
    });
    let handling = handler(req, stream);
    async move {
        let outcome = {
            let reset = std::future::poll_fn(|cx| respond.poll_reset(cx));
            tokio::select! {
                biased;
                // The client reset the stream or the connection broke: the handler is dropped
                // (a held answer ends unrecorded), as hyper does.
                _ = reset => return,
                outcome = handling => outcome,
            }
        };
        match outcome {
            Ok(res) => send(&mut respond, res).await,
            Err(Unanswered::Dropped(reason)) => {
                respond.send_reset(reason.unwrap_or(Reason::INTERNAL_ERROR));
            }
            // Nothing is sent: dropping `respond` makes h2 reset the stream, which the filter
            // keeps from the client.
            Err(Unanswered::GoneAway) => {}
        }
    }
}

/// Sends a whole answer; a client that went away meanwhile is not an error here.
async fn send(respond: &mut SendResponse<Bytes>, res: Response<Full<Bytes>>) {
    let (mut parts, body) = res.into_parts();
    let body = match body.collect().await {
        Ok(body) => body.to_bytes(),
        Err(never) => match never {},
    };
    strip_connection_specific(&mut parts.headers);
    let end = body.is_empty();
    // A body's length, as hyper's server gives it; none for an empty one: a 204 must not
    // have one (RFC 9110 §8.6), and a 304's or a HEAD answer's is the representation's,
    // which only the upstream knows.
    if !end && !parts.headers.contains_key(header::CONTENT_LENGTH) {
        parts
            .headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    }
    if !parts.headers.contains_key(header::DATE) {
        let date = httpdate::fmt_http_date(std::time::SystemTime::now());
        if let Ok(date) = HeaderValue::from_str(&date) {
            parts.headers.insert(header::DATE, date);
        }
    }
    if let Ok(mut stream) = respond.send_response(Response::from_parts(parts, ()), end) {
        if !end {
            let _ = stream.send_data(body, true);
        }
    }
}

fn strip_connection_specific(headers: &mut HeaderMap) {
    for name in CONNECTION_SPECIFIC {
        headers.remove(name);
    }
}
