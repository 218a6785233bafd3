//! What the deadline tests share: a server on loopback, a hyper client, and a ledger of the
//! handler's calls.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{BoxError, Service};

use retry_safety_testing::runtime_server::{accept, listener};

/// Serves `svc` on a fresh loopback port from the test's runtime.
pub(crate) fn serve<S, B>(svc: S) -> SocketAddr
where
    S: Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let (socket, addr) = listener();
    tokio::spawn(accept(socket, svc));
    addr
}

/// What deadline header each call to a next hop brought.
pub(crate) type SeenDeadlines = Arc<Mutex<Vec<Option<String>>>>;

/// A next hop on loopback that answers at once and keeps the `request-timeout-ms` each call
/// brought (`None`: none).
pub(crate) fn next_hop() -> (SocketAddr, SeenDeadlines) {
    let seen = SeenDeadlines::default();
    let record = seen.clone();
    let addr = serve(tower::service_fn(move |req: Request<Incoming>| {
        let header = req
            .headers()
            .get("request-timeout-ms")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        record.lock().expect("seen").push(header);
        async {
            Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(b"next"))))
        }
    }));
    (addr, seen)
}

/// Asserts that the next hop was called once, and that the call carried a deadline of at most
/// `limit_ms`.
pub(crate) fn one_call_within(seen: &SeenDeadlines, limit_ms: u64) {
    let seen = seen.lock().expect("seen").clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let sent: Option<u64> = seen[0].as_deref().and_then(|v| v.parse().ok());
    assert!(
        sent.is_some_and(|ms| ms <= limit_ms),
        "the next hop's request-timeout-ms: {seen:?} (the caller gave {limit_ms} ms)"
    );
}

/// Sends `req` through hyper's client: the answer's head and its body as text.
pub(crate) async fn send(req: Request<Full<Bytes>>) -> (Response<()>, String) {
    let client = Client::builder(TokioExecutor::new()).build_http();
    let res = client.request(req).await.expect("a response");
    let (parts, body) = res.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    (
        Response::from_parts(parts, ()),
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// The handler's calls, by the request's `idempotency-key` (or `-` without one).
#[derive(Clone, Default)]
pub(crate) struct Ledger(Arc<Mutex<HashMap<String, u32>>>);

impl Ledger {
    pub(crate) fn record<B>(&self, req: &Request<B>) {
        let key = req
            .headers()
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned();
        *self.0.lock().expect("ledger").entry(key).or_default() += 1;
    }

    pub(crate) fn runs(&self, key: &str) -> u32 {
        self.0
            .lock()
            .expect("ledger")
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    pub(crate) fn total(&self) -> u32 {
        self.0.lock().expect("ledger").values().sum()
    }
}
