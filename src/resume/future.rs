use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::response::Parts;
use http::{Response, StatusCode};
use http_body::Body;
use pin_project_lite::pin_project;

use super::cut::{BodyCut, BodyCutError, NoResume};
use super::range::Expect;
use super::resumer::{Resume, ResumeSlot, SendRange};
use super::WholeBody;
use crate::BoxError;

/// The most frames without data read from one body inside the attempt: a body of many empty
/// frames is handed on as a stream from there, so the reading ends. Data frames are bounded by
/// the limit's bytes (and held in few pieces: see `WholeBody::push_data`).
const MAX_FRAMES: usize = 1024;

pin_project! {
    /// The response future of [`ReadWhole`](super::ReadWhole): the attempt, then the reading
    /// of a body within the limit.
    pub struct ResponseFuture<F, B> {
        #[pin]
        state: State<F, B>,
        limit: u64,
        // What sends the request again to resume a streamed body (a GET only), or why
        // there is nothing.
        again: Option<Result<SendRange<B>, NoResume>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B> {
        Calling { #[pin] future: F },
        // Boxed: only a response whose body is read pays for the reading's state.
        Reading { reading: Box<Reading<B>> },
        Done,
    }
}

struct Reading<B> {
    parts: Option<Parts>,
    body: Option<B>,
    whole: Option<WholeBody<B>>,
    frames: usize,
}

impl<F, B> ResponseFuture<F, B> {
    pub(crate) fn new(future: F, limit: u64, again: Result<SendRange<B>, NoResume>) -> Self {
        ResponseFuture {
            state: State::Calling { future },
            limit,
            again: Some(again),
        }
    }
}

impl<F, B> std::fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Calling { .. } => "calling",
            State::Reading { .. } => "reading the body",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("limit", &self.limit)
            .finish()
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Output = Result<Response<WholeBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Calling { future } => {
                    let res = ready!(future.poll(cx))?;
                    let status = res.status();
                    // Only a body whose length the transport knows to be within the limit is
                    // read here: a stream (server-sent events) could hold the attempt forever.
                    let within = res
                        .body()
                        .size_hint()
                        .exact()
                        .is_some_and(|len| len <= *this.limit);
                    if !within {
                        return Poll::Ready(Ok(streamed(res, this.again.take())));
                    }
                    let (parts, body) = res.into_parts();
                    let exact = body.size_hint().exact().is_some();
                    let reading = Box::new(Reading {
                        parts: Some(parts),
                        body: Some(body),
                        whole: Some(WholeBody::new(status, exact)),
                        frames: 0,
                    });
                    this.state.set(State::Reading { reading });
                }
                StateProj::Reading { reading } => {
                    let res = ready!(reading.poll_read(cx));
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(res));
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}

/// A body past the limit, handed on as it streams, ready to resume with `Range` if its
/// request and its response allow it.
fn streamed<B>(
    res: Response<B>,
    again: Option<Result<SendRange<B>, NoResume>>,
) -> Response<WholeBody<B>>
where
    B: Body,
{
    let (mut parts, body) = res.into_parts();
    let status = parts.status;
    let total = body.size_hint().exact();
    let whole = WholeBody::unread(status, body);
    let whole = match again.unwrap_or(Err(NoResume::NoSender)) {
        Err(why) => whole.not_resuming(why),
        Ok(_) if status != StatusCode::OK => whole.not_resuming(NoResume::NotTheSame),
        Ok(send) => match Expect::of(&parts.headers, total) {
            Err(why) => whole.not_resuming(why),
            Ok(expect) => {
                let slot = ResumeSlot::default();
                parts.extensions.insert(slot.clone());
                whole.resuming(Resume::new(send, slot, expect, status))
            }
        },
    };
    Response::from_parts(parts, whole)
}

impl<B> Reading<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    /// Reads the body to its end, its first error, or `MAX_FRAMES` frames without data.
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<Response<WholeBody<B>>> {
        let whole = self.whole.as_mut().expect("read once");
        let body = self.body.as_mut().expect("read once");
        while self.frames < MAX_FRAMES {
            match ready!(Pin::new(&mut *body).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(chunk) if chunk.is_empty() => self.frames += 1,
                    Ok(chunk) => whole.push_data(chunk),
                    Err(frame) => {
                        if let Ok(trailers) = frame.into_trailers() {
                            whole.set_trailers(trailers);
                        }
                    }
                },
                Some(Err(err)) => {
                    let mut parts = self.parts.take().expect("read once");
                    let received = whole.received();
                    let cut = BodyCutError::new(parts.status, received, err.into());
                    parts.extensions.insert(BodyCut { received });
                    let whole = self.whole.take().expect("read once").then_fail(cut);
                    return Poll::Ready(Response::from_parts(parts, whole));
                }
                None => return Poll::Ready(self.finish(false)),
            }
        }
        // Too many frames for a body worth holding: the rest streams.
        Poll::Ready(self.finish(true))
    }

    fn finish(&mut self, stream_rest: bool) -> Response<WholeBody<B>> {
        let parts = self.parts.take().expect("read once");
        let mut whole = self.whole.take().expect("read once");
        if let Some(rest) = self.body.take().filter(|_| stream_rest) {
            whole = whole.then(rest);
        }
        Response::from_parts(parts, whole)
    }
}
