//! A nested call a handler starts in its `call` (a hand-written tower `Service`, the way
//! tower's own docs write one: the outbound future is made in `call`, then awaited in the
//! response future) inherits the caller's deadline.
//!
//! Found by the adversarial review of issue 48.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::util::BoxCloneService;
use tower::{BoxError, Layer, Service, ServiceBuilder};
use tower_idempotency_keys::deadline::DeadlineLayer;
use tower_retry_safety::RetryPolicy;

use super::loopback::{next_hop, one_call_within, send, serve};

type Outbound = BoxCloneService<Request<Full<Bytes>>, Response<Incoming>, BoxError>;

/// A gateway: each inbound request becomes a new outbound one to `next`, started in `call`.
#[derive(Clone)]
struct Gateway {
    outbound: Outbound,
    next: SocketAddr,
}

impl Service<Request<Incoming>> for Gateway {
    type Response = Response<Full<Bytes>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.outbound.poll_ready(cx)
    }

    fn call(&mut self, _req: Request<Incoming>) -> Self::Future {
        let nested = Request::get(format!("http://{}/nested", self.next))
            .body(Full::new(Bytes::new()))
            .expect("request");
        let sent = self.outbound.call(nested);
        Box::pin(async move {
            let res = sent.await?;
            Ok(Response::new(Full::new(Bytes::from(
                res.status().as_u16().to_string(),
            ))))
        })
    }
}

/// The caller gives 2 s (`request-timeout-ms: 2000`); the gateway's policy has no deadline of
/// its own and inherits the inbound one (its default), and hands deadlines on to the next
/// hop. Expected: the next hop receives `request-timeout-ms` of at most 2000. Found: none —
/// `Deadline`'s future calls the inner service outside the deadline's scope
/// (`deadline::scope(inbound, service.call(req))` evaluates `call` first), so a nested call
/// made in `call` reads no `deadline::current()`, and the gateway's fresh request carries no
/// `Inbound` in its extensions: the next hop works unbounded for a caller gone after 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_call_started_in_call_inherits_the_deadline() {
    let (next, seen) = next_hop();
    let policy = RetryPolicy::builder()
        .send_deadline_to("127.0.0.1")
        .build()
        .expect("policy");
    let outbound: Outbound = BoxCloneService::new(
        ServiceBuilder::new()
            .map_err(BoxError::from)
            .service(policy.layer(Client::builder(TokioExecutor::new()).build_http())),
    );
    let addr = serve(DeadlineLayer::new(Duration::from_secs(30)).layer(Gateway { outbound, next }));
    let req = Request::get(format!("http://{addr}/in"))
        .header("request-timeout-ms", "2000")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let (res, body) = send(req).await;
    assert_eq!((res.status(), body.as_str()), (StatusCode::OK, "200"));
    one_call_within(&seen, 2_000);
}
