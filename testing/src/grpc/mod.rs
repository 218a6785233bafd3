//! A real tonic server on loopback for the gRPC tests, example and bench: the `lab.v1.Ledger`
//! service counts what each call applies, and a fault layer in front of it breaks a call's
//! first attempt as its `x-fault` metadata asks (`x-call-id` names the call across attempts).
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, Request, Response};
use tonic::body::Body;
use tonic::transport::server::TcpIncoming;
use tonic::{Status, Streaming};
use tower::{Layer, Service};

pub mod misbehaving_server;
pub mod stack;

pub mod lab {
    include!("lab.v1.rs");
}

use lab::ledger_server::{Ledger, LedgerServer};
use lab::{CountRequest, Entry, Receipt};

/// The proto of the lab service, compiled by protox (no `protoc`) into a descriptor set.
pub fn descriptor_set() -> prost_types::FileDescriptorSet {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/grpc");
    protox::compile([format!("{dir}/lab.proto")], [dir]).expect("lab.proto compiles")
}

/// A fault on a call's first attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The handler applies the call, then the answer is a trailers-only UNAVAILABLE.
    UnavailableAfterApply,
    /// A trailers-only UNAVAILABLE; the handler is not called.
    UnavailableBefore,
    /// A trailers-only RESOURCE_EXHAUSTED; the handler is not called.
    ResourceExhaustedBefore,
    /// UNAVAILABLE with `grpc-retry-pushback-ms: -1`; the handler is not called.
    UnavailableDoNotRetry,
    /// The handler applies the call, then the stream is reset (no answer).
    ResetAfterApply,
    /// The handler applies the call, then the answer waits this long.
    SlowAfterApply(Duration),
}

impl Fault {
    pub fn header(self) -> String {
        match self {
            Fault::UnavailableAfterApply => "unavailable-after".into(),
            Fault::UnavailableBefore => "unavailable-before".into(),
            Fault::ResourceExhaustedBefore => "exhausted-before".into(),
            Fault::UnavailableDoNotRetry => "unavailable-do-not-retry".into(),
            Fault::ResetAfterApply => "reset-after".into(),
            Fault::SlowAfterApply(d) => format!("slow-after-{}", d.as_millis()),
        }
    }

    fn parse(text: &str) -> Option<Fault> {
        Some(match text {
            "unavailable-after" => Fault::UnavailableAfterApply,
            "unavailable-before" => Fault::UnavailableBefore,
            "exhausted-before" => Fault::ResourceExhaustedBefore,
            "unavailable-do-not-retry" => Fault::UnavailableDoNotRetry,
            "reset-after" => Fault::ResetAfterApply,
            slow => Fault::SlowAfterApply(Duration::from_millis(
                slow.strip_prefix("slow-after-")?.parse().ok()?,
            )),
        })
    }
}

/// What the server saw: per call id, how many times a handler applied it, the messages of
/// each client stream, and the headers of every attempt.
#[derive(Clone, Default)]
pub struct Lab {
    applied: Arc<Mutex<HashMap<String, u32>>>,
    attempts: Arc<Mutex<HashMap<String, Vec<HeaderMap>>>>,
    streamed: Arc<Mutex<HashMap<String, Vec<usize>>>>,
    faulted: Arc<Mutex<HashSet<String>>>,
}

impl Lab {
    /// How many times the handler applied call `id`.
    pub fn applied(&self, id: &str) -> u32 {
        self.applied.lock().unwrap().get(id).copied().unwrap_or(0)
    }

    /// The headers of each attempt of call `id` that reached the server.
    pub fn attempts(&self, id: &str) -> Vec<HeaderMap> {
        self.attempts
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .unwrap_or_default()
    }

    /// The messages each handler run of stream `id` read.
    pub fn streamed(&self, id: &str) -> Vec<usize> {
        self.streamed
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .unwrap_or_default()
    }

    /// Calls applied more than once.
    pub fn applied_twice(&self) -> usize {
        self.applied
            .lock()
            .unwrap()
            .values()
            .filter(|n| **n > 1)
            .count()
    }

    fn apply(&self, id: &str) -> u64 {
        let mut applied = self.applied.lock().unwrap();
        let n = applied.entry(id.to_owned()).or_default();
        *n += 1;
        u64::from(*n)
    }
}

#[tonic::async_trait]
impl Ledger for Lab {
    async fn append(&self, req: tonic::Request<Entry>) -> Result<tonic::Response<Receipt>, Status> {
        // `x-delay-ms`: the handler takes this long before it applies.
        let delay = req
            .metadata()
            .get("x-delay-ms")
            .and_then(|v| v.to_str().ok()?.parse().ok());
        if let Some(ms) = delay {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        let applied = self.apply(&req.get_ref().id);
        Ok(tonic::Response::new(Receipt { applied }))
    }

    async fn count(
        &self,
        req: tonic::Request<CountRequest>,
    ) -> Result<tonic::Response<Receipt>, Status> {
        let applied = self.apply(&req.get_ref().id);
        Ok(tonic::Response::new(Receipt { applied }))
    }

    async fn put(&self, req: tonic::Request<Entry>) -> Result<tonic::Response<Receipt>, Status> {
        let applied = self.apply(&req.get_ref().id);
        Ok(tonic::Response::new(Receipt { applied }))
    }

    async fn upload(
        &self,
        req: tonic::Request<Streaming<Entry>>,
    ) -> Result<tonic::Response<Receipt>, Status> {
        self.stream(req).await
    }

    async fn sum(
        &self,
        req: tonic::Request<Streaming<Entry>>,
    ) -> Result<tonic::Response<Receipt>, Status> {
        self.stream(req).await
    }
}

impl Lab {
    /// Reads the whole stream, then applies it once under the first entry's id.
    async fn stream(
        &self,
        req: tonic::Request<Streaming<Entry>>,
    ) -> Result<tonic::Response<Receipt>, Status> {
        let mut stream = req.into_inner();
        let (mut id, mut count) = (String::new(), 0);
        while let Some(entry) = stream.message().await? {
            if count == 0 {
                id = entry.id;
            }
            count += 1;
        }
        self.streamed
            .lock()
            .unwrap()
            .entry(id.clone())
            .or_default()
            .push(count);
        let applied = self.apply(&id);
        Ok(tonic::Response::new(Receipt { applied }))
    }
}

/// The fault layer: in front of the service, it records each attempt and breaks the first
/// attempt of a call as its `x-fault` says.
#[derive(Clone)]
pub struct Faults<S> {
    inner: S,
    lab: Lab,
}

impl<S> Layer<S> for Lab {
    type Service = Faults<S>;
    fn layer(&self, inner: S) -> Faults<S> {
        Faults {
            inner,
            lab: self.clone(),
        }
    }
}

fn trailers_only(status: Status) -> Response<Body> {
    status.into_http()
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, RB> Service<Request<Body>> for Faults<S>
where
    S: Service<Request<Body>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    RB: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Response<Body>, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let id = header("x-call-id").unwrap_or_default();
        let fault = header("x-fault").and_then(|f| Fault::parse(&f));
        self.lab
            .attempts
            .lock()
            .unwrap()
            .entry(id.clone())
            .or_default()
            .push(req.headers().clone());
        let first = self.lab.faulted.lock().unwrap().insert(id);
        let fault = fault.filter(|_| first);
        let mut inner = self.inner.clone();
        std::mem::swap(&mut inner, &mut self.inner);
        Box::pin(async move {
            match fault {
                Some(Fault::UnavailableBefore) => {
                    return Ok(trailers_only(Status::unavailable("lab: before")))
                }
                Some(Fault::ResourceExhaustedBefore) => {
                    return Ok(trailers_only(Status::resource_exhausted("lab: before")))
                }
                Some(Fault::UnavailableDoNotRetry) => {
                    let mut res = trailers_only(Status::unavailable("lab: go away"));
                    res.headers_mut().insert(
                        "grpc-retry-pushback-ms",
                        http::HeaderValue::from_static("-1"),
                    );
                    return Ok(res);
                }
                _ => {}
            }
            let res = inner.call(req).await.map_err(Into::into)?.map(Body::new);
            match fault {
                Some(Fault::UnavailableAfterApply) => {
                    Ok(trailers_only(Status::unavailable("lab: after")))
                }
                Some(Fault::ResetAfterApply) => {
                    Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset).into())
                }
                Some(Fault::SlowAfterApply(d)) => {
                    tokio::time::sleep(d).await;
                    Ok(res)
                }
                _ => Ok(res),
            }
        })
    }
}

/// Starts the lab server on 127.0.0.1 with `wrap` in front of the fault layer; returns its
/// address and what it saw.
pub async fn serve() -> (SocketAddr, Lab) {
    serve_with(tower::layer::util::Identity::new()).await
}

pub async fn serve_with<L, RB>(outer: L) -> (SocketAddr, Lab)
where
    L: Layer<Faults<tonic::service::Routes>>,
    L::Service: Service<Request<Body>, Response = Response<RB>> + Clone + Send + 'static,
    <L::Service as Service<Request<Body>>>::Future: Send,
    <L::Service as Service<Request<Body>>>::Error:
        Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
    RB: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    RB::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let lab = Lab::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = TcpIncoming::from(listener);
    let routes = tonic::service::Routes::new(LedgerServer::new(lab.clone()));
    let service = outer.layer(lab.layer(routes));
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .serve_with_incoming(service, incoming)
            .await;
    });
    (addr, lab)
}

/// Starts the lab server with `keyed` between the fault layer and the service (an
/// `IdempotencyLayer`): a fault after apply breaks the answer after the layer stored it.
pub async fn serve_keyed<L, RB>(keyed: L) -> (SocketAddr, Lab)
where
    L: Layer<tonic::service::Routes>,
    L::Service: Service<Request<Body>, Response = Response<RB>> + Clone + Send + 'static,
    <L::Service as Service<Request<Body>>>::Future: Send,
    <L::Service as Service<Request<Body>>>::Error: Into<BoxError>,
    RB: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    let lab = Lab::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = TcpIncoming::from(listener);
    let routes = tonic::service::Routes::new(LedgerServer::new(lab.clone()));
    let service = lab.layer(keyed.layer(routes));
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .serve_with_incoming(service, incoming)
            .await;
    });
    (addr, lab)
}

/// A tonic Channel to the lab server.
pub async fn channel(addr: SocketAddr) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// A request whose metadata names the call and its fault.
pub fn request<T>(message: T, id: &str, fault: Option<Fault>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    req.metadata_mut().insert("x-call-id", id.parse().unwrap());
    if let Some(fault) = fault {
        req.metadata_mut()
            .insert("x-fault", fault.header().parse().unwrap());
    }
    req
}
