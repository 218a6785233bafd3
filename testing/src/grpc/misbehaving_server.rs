//! A misbehaving gRPC server and a client for it: a layer (`Rev`) in front of the real tonic
//! server on 127.0.0.1 that answers as a misbehaving or unusual server would (odd
//! `grpc-status` spellings, a status after messages, a stream answered before its end, custom
//! trailers, a handler's own UNAVAILABLE), a lab client through the retry layer, and a time
//! limit on every call (a hang is a defect).
//!
//! Written for the adversarial review of the gRPC support (issue 24).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::grpc::lab::Entry;
use crate::grpc::{request, serve_with};
use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body::Frame;
use http_body_util::BodyExt;
use tonic::body::Body;
use tower::{Layer, Service};
use tower_retry_safety::{RetryPolicy, RetryPolicyBuilder};
type BoxError = Box<dyn std::error::Error + Send + Sync>;
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Every call ends within this long, or the test fails (a hang is a defect).
const LIMIT: Duration = Duration::from_secs(20);

pub async fn within<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(LIMIT, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: hung for {LIMIT:?}"))
}

pub fn builder() -> RetryPolicyBuilder {
    RetryPolicy::builder()
        .jitter(false)
        .backoff(Duration::from_millis(5), Duration::from_millis(20))
        .max_retries(2)
        .attempt_timeout(Duration::from_secs(2))
        .grpc_descriptors(&crate::grpc::descriptor_set())
}

pub use super::stack::{client, Client};

pub fn entry(id: &str) -> Entry {
    Entry {
        id: id.into(),
        payload: vec![7; 16],
    }
}

/// A lab request that also asks the reviewer's layer for `rev` (see [`Rev`]).
pub fn rev_request<T>(message: T, id: &str, rev: &str) -> tonic::Request<T> {
    let mut req = request(message, id, None);
    req.metadata_mut().insert("x-rev", rev.parse().unwrap());
    req
}

// ---------------------------------------------------------------------------------------
// The reviewer's layer. `x-rev` (fields split by `|`):
// - `after|<status bytes>[|<pushback>]`: the handler runs (applies), then the answer is a
//   trailers-only response with `grpc-status` exactly these bytes;
// - `before|<status bytes>[|<pushback>]`: the same without running the handler;
// - `then|<status>|<message>`: the handler's answer (headers, message), with its trailers
//   rewritten to this status and message, plus `x-custom-trailer: kept`;
// - `partial`: reads the client stream's first message, counts it applied (`Rev::applied`),
//   then answers a trailers-only UNAVAILABLE while the client is still sending;
// - `unavailable-first`: the first call with this `x-call-id` is answered UNAVAILABLE by
//   the handler's side without running it (nothing applied); later ones run.
// ---------------------------------------------------------------------------------------

#[derive(Clone, Default)]
pub struct Rev {
    applied: Arc<Mutex<HashMap<String, u32>>>,
    calls: Arc<Mutex<HashMap<String, u32>>>,
    seen: Arc<Mutex<HashSet<String>>>,
}

impl Rev {
    pub fn applied(&self, id: &str) -> u32 {
        self.applied.lock().unwrap().get(id).copied().unwrap_or(0)
    }

    /// Attempts of call `id` that reached this layer (it answers some without the lab).
    pub fn calls(&self, id: &str) -> u32 {
        self.calls.lock().unwrap().get(id).copied().unwrap_or(0)
    }
}

#[derive(Clone)]
pub struct RevSvc<S> {
    inner: S,
    rev: Rev,
}

impl<S> Layer<S> for Rev {
    type Service = RevSvc<S>;
    fn layer(&self, inner: S) -> RevSvc<S> {
        RevSvc {
            inner,
            rev: self.clone(),
        }
    }
}

fn trailers_only(status: &str, pushback: Option<&str>) -> Response<Body> {
    let mut res = Response::new(Body::empty());
    let headers = res.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", HeaderValue::from_str(status).unwrap());
    headers.insert("grpc-message", HeaderValue::from_static("rev"));
    if let Some(ms) = pushback {
        headers.insert("grpc-retry-pushback-ms", HeaderValue::from_str(ms).unwrap());
    }
    res
}

/// A body whose trailers are rewritten.
struct EditTrailers {
    inner: Body,
    status: String,
    message: String,
}

impl http_body::Body for EditTrailers {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(match frame.into_trailers() {
                Ok(mut trailers) => {
                    trailers.insert("grpc-status", HeaderValue::from_str(&this.status).unwrap());
                    trailers.insert(
                        "grpc-message",
                        HeaderValue::from_str(&this.message).unwrap(),
                    );
                    trailers.insert("x-custom-trailer", HeaderValue::from_static("kept"));
                    Frame::trailers(trailers)
                }
                Err(frame) => frame,
            }))),
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}

impl<S, B, RB> Service<Request<B>> for RevSvc<S>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Response<Body>, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
                .unwrap_or_default()
        };
        let (mode, id) = (header("x-rev"), header("x-call-id"));
        let first = self.rev.seen.lock().unwrap().insert(id.clone());
        *self
            .rev
            .calls
            .lock()
            .unwrap()
            .entry(id.clone())
            .or_default() += 1;
        let rev = self.rev.clone();
        let mut inner = self.inner.clone();
        std::mem::swap(&mut inner, &mut self.inner);
        Box::pin(async move {
            let fields: Vec<&str> = mode.split('|').collect();
            match fields[..] {
                ["after", status, ..] => {
                    let res = inner.call(req).await.map_err(Into::into)?;
                    drop(res);
                    Ok(trailers_only(status, fields.get(2).copied()))
                }
                ["before", status, ..] => Ok(trailers_only(status, fields.get(2).copied())),
                ["then", status, message] => {
                    let res = inner.call(req).await.map_err(Into::into)?;
                    Ok(res.map(|b| {
                        Body::new(EditTrailers {
                            inner: Body::new(b),
                            status: status.to_owned(),
                            message: message.to_owned(),
                        })
                    }))
                }
                ["partial"] => {
                    let mut body = Box::pin(req.into_body());
                    let first_frame = body.as_mut().frame().await;
                    assert!(first_frame.is_some(), "the stream's first message");
                    *rev.applied.lock().unwrap().entry(id).or_default() += 1;
                    Ok(trailers_only("14", None))
                }
                ["unavailable-first"] if first => Ok(trailers_only("14", None)),
                _ => Ok(inner.call(req).await.map_err(Into::into)?.map(Body::new)),
            }
        })
    }
}

pub async fn serve_rev() -> (std::net::SocketAddr, crate::grpc::Lab, Rev) {
    let rev = Rev::default();
    let (addr, lab) = serve_with(rev.clone()).await;
    (addr, lab, rev)
}
