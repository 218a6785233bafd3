//! `run_stack`: a tower client stack run through a fresh upstream and proxy on loopback,
//! with the default mix of faults, and what the proxy counted.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use tower::{Service, ServiceExt};

use crate::error::LabError;
use crate::proxy::{Proxy, ProxyConfig};
use crate::report::ProxyReport;
use crate::routes::{RouteKind, RouteKinds};
use crate::serve::Upstream;

/// The slow fault's hold: the stacks' clients give up long before.
const SLOW: Duration = Duration::from_secs(20);
/// Operations in flight at once: enough to overlap, few enough that a loaded machine answers
/// a plain request well within a second.
const IN_FLIGHT: usize = 24;

type Req = Request<Full<Bytes>>;

/// The stack's routes: payments are created (a write) and read.
fn payment_routes() -> RouteKinds {
    let mut routes = RouteKinds::new();
    // Both rules are fixed and valid: an error here is a bug, not the caller's.
    let _ = routes.add("--write", "POST /v1/payments", RouteKind::Write);
    let _ = routes.add("--read", "GET /v1/payments/{id}", RouteKind::Read);
    routes
}

/// A fresh upstream and proxy on loopback (default mix), `ops` writes and `ops` reads sent
/// through `svc`, 24 at a time; what the proxy counted.
pub async fn run_stack<S, B>(svc: S, ops: usize) -> Result<ProxyReport, LabError>
where
    S: Service<Req, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    B: http_body::Body<Data = Bytes> + Send + 'static,
{
    run_stack_with(svc, ops, IN_FLIGHT).await
}

/// [`run_stack`] with `in_flight` operations at a time.
async fn run_stack_with<S, B>(svc: S, ops: usize, in_flight: usize) -> Result<ProxyReport, LabError>
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
        .slow(SLOW);
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
