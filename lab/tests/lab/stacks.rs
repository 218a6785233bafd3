//! What the tests run clients with: the routes of `run_stack`, `run_stack` with more
//! operations in flight, and the retry policy people typically write for `tower::retry`
//! (the binary's `demo` has its own: both are the library's callers, not part of it).

use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use retry_safety_lab::routes::{RouteKind, RouteKinds};
use retry_safety_lab::{LabError, Proxy, ProxyConfig, ProxyReport, Upstream};
use tower::retry::Policy;
use tower::{Service, ServiceExt};
use tower_retry_safety::BoxError;

type Req = Request<Full<Bytes>>;

/// The routes `run_stack` counts under: payments are created (a write) and read.
pub(crate) fn payment_routes() -> RouteKinds {
    let mut routes = RouteKinds::new();
    routes
        .add("--write", "POST /v1/payments", RouteKind::Write)
        .expect("valid");
    routes
        .add("--read", "GET /v1/payments/{id}", RouteKind::Read)
        .expect("valid");
    routes
}

/// `run_stack` (a fresh upstream and proxy on loopback, default mix, a 20 s slow hold, `ops`
/// writes and `ops` reads sent through `svc`) with `in_flight` operations at a time.
pub(crate) async fn run_stack_with<S, B>(
    svc: S,
    ops: usize,
    in_flight: usize,
) -> Result<ProxyReport, LabError>
where
    S: Service<Req, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    B: http_body::Body<Data = Bytes> + Send + 'static,
{
    let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let upstream = Upstream::start(loopback).await?;
    let config = ProxyConfig::new(&format!("http://{}", upstream.addr()))?
        .routes(payment_routes())
        .slow(Duration::from_secs(20));
    let proxy = Proxy::start(config, loopback).await?;
    let base = format!("http://{}", proxy.addr());
    let mut tasks = tokio::task::JoinSet::new();
    let in_flight = std::sync::Arc::new(tokio::sync::Semaphore::new(in_flight.max(1)));
    for i in 0..ops {
        for method in [Method::POST, Method::GET] {
            let svc = svc.clone();
            let in_flight = in_flight.clone();
            let (uri, body) = if method == Method::POST {
                (
                    format!("{base}/v1/payments"),
                    format!("{{\"ref\":\"op-{i}\",\"amount\":100}}"),
                )
            } else {
                (format!("{base}/v1/payments/{i}"), String::new())
            };
            tasks.spawn(async move {
                let Ok(_permit) = in_flight.acquire_owned().await else {
                    return;
                };
                let mut req = Request::new(Full::new(Bytes::from(body)));
                *req.method_mut() = method;
                let Ok(uri) = uri.parse() else { return };
                *req.uri_mut() = uri;
                if let Ok(res) = svc.oneshot(req).await {
                    let _ = res.into_body().collect().await;
                }
            });
        }
    }
    while tasks.join_next().await.is_some() {}
    Ok(proxy.report())
}

/// The retry policy people typically write for `tower::retry`: retry errors, 5xx and 429, up
/// to 3 times, after a short pause.
#[derive(Clone, Debug)]
pub(crate) struct TypicalPolicy {
    left: u32,
}

impl TypicalPolicy {
    /// Up to `retries` retries.
    pub(crate) fn new(retries: u32) -> Self {
        TypicalPolicy { left: retries }
    }
}

impl<B> Policy<Req, Response<B>, BoxError> for TypicalPolicy {
    /// The pause before a retry.
    type Future = Pin<Box<tokio::time::Sleep>>;

    /// Any error, 5xx or 429 is retried, whatever the request, while retries are left: the
    /// writes this applies twice are the lab's point.
    fn retry(
        &mut self,
        _req: &mut Req,
        result: &mut Result<Response<B>, BoxError>,
    ) -> Option<Self::Future> {
        let transient = match result {
            Ok(res) => res.status().is_server_error() || res.status() == 429,
            Err(_) => true,
        };
        if !transient || self.left == 0 {
            return None;
        }
        self.left -= 1;
        Some(Box::pin(tokio::time::sleep(Duration::from_millis(20))))
    }

    /// A copy of the method, URI, headers and body.
    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        let mut copy = Request::new(req.body().clone());
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        *copy.headers_mut() = req.headers().clone();
        Some(copy)
    }
}
