//! The replay buffer's test harness: an inner service (`Reader`) that reads some frames of each
//! attempt's body, then ends the attempt as planned (ok, reset, 503), what each attempt received,
//! the streamed bodies sent through the layer, and the report of an outcome.

use std::io;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full, StreamBody};
use tower::{Layer, Service, ServiceExt};
use tower_retry_safety::{RetryPolicy, RetryReport};

pub(crate) type Chunks = Vec<Vec<u8>>;

pub(crate) type Stream =
    StreamBody<futures_util::stream::Iter<std::vec::IntoIter<io::Result<Frame<Bytes>>>>>;

/// How one attempt ends, after the inner service read `frames` frames of its body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum End {
    Ok,
    /// The connection reset: ambiguous, and a PUT is retried.
    Reset,
    /// A 503: retried for a PUT, if the body was sent to its end.
    Unavailable,
}

/// What one attempt's inner service received.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Received {
    pub(crate) data: Vec<Bytes>,
    pub(crate) trailers: Option<HeaderMap>,
    /// It read past the last frame.
    pub(crate) saw_end: bool,
    /// What the body's size hint said when the attempt started.
    pub(crate) exact_len: Option<u64>,
}

/// An inner service that reads `frames` frames of each attempt's body, drops the body, then
/// ends the attempt as planned.
#[derive(Clone)]
pub(crate) struct Reader {
    pub(crate) plan: Arc<Vec<(usize, End)>>,
    pub(crate) log: Arc<Mutex<Vec<Received>>>,
    /// Keep each attempt's body instead of dropping it (a transport that holds on to it).
    pub(crate) hold: Arc<Mutex<Vec<Box<dyn std::any::Any + Send>>>>,
    pub(crate) holds: bool,
}

impl Reader {
    pub(crate) fn new(plan: Vec<(usize, End)>) -> Reader {
        Reader {
            plan: Arc::new(plan),
            log: Arc::default(),
            hold: Arc::default(),
            holds: false,
        }
    }

    pub(crate) fn received(&self) -> Vec<Received> {
        self.log.lock().unwrap().clone()
    }
}

impl<B> Service<Request<B>> for Reader
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::fmt::Debug,
{
    type Response = Response<Full<Bytes>>;
    type Error = io::Error;
    type Future = BoxFuture<'static, Result<Self::Response, io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let me = self.clone();
        Box::pin(async move {
            let attempt = me.log.lock().unwrap().len();
            let (frames, end) = me.plan[attempt];
            let mut body = req.into_body();
            let mut got = Received {
                exact_len: body.size_hint().exact(),
                ..Received::default()
            };
            for _ in 0..frames {
                match body.frame().await {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => got.data.push(data),
                        Err(frame) => got.trailers = frame.into_trailers().ok(),
                    },
                    Some(Err(e)) => panic!("the body failed: {e:?}"),
                    None => {
                        got.saw_end = true;
                        break;
                    }
                }
            }
            me.log.lock().unwrap().push(got);
            if me.holds {
                me.hold.lock().unwrap().push(Box::new(body));
            } else {
                drop(body);
            }
            match end {
                End::Ok => Ok(Response::new(Full::new(Bytes::from_static(b"ok")))),
                End::Reset => Err(io::Error::from(io::ErrorKind::ConnectionReset)),
                End::Unavailable => {
                    let mut res = Response::new(Full::default());
                    *res.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
                    Ok(res)
                }
            }
        })
    }
}

pub(crate) fn policy(limit: usize) -> RetryPolicy {
    RetryPolicy::builder()
        .max_retries(3)
        .jitter(false)
        .backoff(Duration::from_millis(10), Duration::from_millis(10))
        .no_budget()
        .replay_buffer(limit)
        .build()
        .unwrap()
}

pub(crate) fn frames(chunks: &Chunks, trailers: bool) -> Vec<io::Result<Frame<Bytes>>> {
    let mut frames: Vec<_> = chunks
        .iter()
        .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
        .collect();
    if trailers {
        frames.push(Ok(Frame::trailers(trailer_map())));
    }
    frames
}

pub(crate) fn trailer_map() -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert("x-checksum", HeaderValue::from_static("abc"));
    t
}

pub(crate) fn stream(chunks: &Chunks, trailers: bool) -> Stream {
    StreamBody::new(futures_util::stream::iter(frames(chunks, trailers)))
}

pub(crate) fn put<B>(body: B) -> Request<B> {
    Request::put("http://api.test/v1/files/1")
        .body(body)
        .unwrap()
}

pub(crate) async fn send<B>(
    policy: RetryPolicy,
    reader: &Reader,
    req: Request<B>,
) -> Result<Response<Full<Bytes>>, tower_retry_safety::Error>
where
    Reader: Service<Request<B>, Response = Response<Full<Bytes>>, Error = io::Error>,
    <Reader as Service<Request<B>>>::Future: Send,
    B: tower_retry_safety::ReplayBody,
{
    policy.layer(reader.clone()).oneshot(req).await
}

pub(crate) fn report<T>(out: &Result<Response<T>, tower_retry_safety::Error>) -> RetryReport {
    match out {
        Ok(res) => RetryReport::of(res).unwrap().clone(),
        Err(e) => e.report().unwrap().clone(),
    }
}

/// The whole body as frames: what every complete attempt must receive.
pub(crate) fn whole(chunks: &Chunks, trailers: bool) -> Received {
    Received {
        data: chunks.iter().map(|c| Bytes::copy_from_slice(c)).collect(),
        trailers: trailers.then(trailer_map),
        saw_end: true,
        exact_len: None,
    }
}
