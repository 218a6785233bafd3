//! What the renewal tests among busy neighbours share: a store that counts what the layer asks
//! of it, the lab the handlers share with the test (runs per key, the gates that hold them), a
//! handler busy in stretches until the lab opens, its server on a runtime of its own, keyed
//! POSTs sent all at once, and counts of their answers.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::SERIAL;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retry_safety_testing::runtime_server::{serve_on, Flavour, Server};
use tower::Layer;
use tower_idempotency_keys::{
    Begin, Entry, FencingToken, Fingerprint, IdempotencyLayer, IdempotencyStore, StoreError,
    StoredResponse,
};

pub(crate) const LEASE: Duration = Duration::from_millis(400);

pub(crate) fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A store that counts what the layer asks of it, and which renewals it refused.
pub(crate) struct Counting<St> {
    pub(crate) inner: St,
    pub(crate) renewed: AtomicUsize,
    pub(crate) renew_refused: AtomicUsize,
    pub(crate) completed: AtomicUsize,
    pub(crate) released: AtomicUsize,
}

impl<St> Counting<St> {
    pub(crate) fn new(inner: St) -> Arc<Self> {
        Arc::new(Counting {
            inner,
            renewed: AtomicUsize::new(0),
            renew_refused: AtomicUsize::new(0),
            completed: AtomicUsize::new(0),
            released: AtomicUsize::new(0),
        })
    }
}

/// The layer takes a store by value: a shared handle on a counting one.
#[derive(Clone)]
pub(crate) struct Shared<St>(pub(crate) Arc<Counting<St>>);

impl<St: IdempotencyStore> IdempotencyStore for Shared<St> {
    fn begin(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send {
        self.0.inner.begin(key, fingerprint, lease)
    }

    fn renew(
        &self,
        key: &str,
        token: FencingToken,
        lease: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let counting = self.0.clone();
        let call = self.0.inner.renew(key, token, lease);
        async move {
            let r = call.await;
            match &r {
                Ok(()) => counting.renewed.fetch_add(1, Ordering::SeqCst),
                Err(_) => counting.renew_refused.fetch_add(1, Ordering::SeqCst),
            };
            r
        }
    }

    fn complete(
        &self,
        key: &str,
        token: FencingToken,
        fingerprint: Fingerprint,
        response: StoredResponse,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.0.completed.fetch_add(1, Ordering::SeqCst);
        self.0
            .inner
            .complete(key, token, fingerprint, response, ttl)
    }

    fn get(&self, key: &str) -> impl Future<Output = Result<Option<Entry>, StoreError>> + Send {
        self.0.inner.get(key)
    }

    fn release(
        &self,
        key: &str,
        token: FencingToken,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.0.released.fetch_add(1, Ordering::SeqCst);
        self.0.inner.release(key, token)
    }
}

/// What the handlers share with the test: runs per key, and the gates that hold them.
#[derive(Default)]
pub(crate) struct Lab {
    pub(crate) runs: Mutex<HashMap<String, u32>>,
    /// Keys whose handler answers 503 on its first run (a declined 5xx frees the key).
    pub(crate) fail_first: Mutex<Vec<String>>,
    /// While false, a handler works on in stretches of `stretch`, yielding between them.
    pub(crate) open: AtomicBool,
    /// Keys whose handler ends at once whatever `open` says.
    pub(crate) short: Mutex<Vec<String>>,
    pub(crate) started: AtomicUsize,
}

impl Lab {
    pub(crate) fn runs(&self, key: &str) -> u32 {
        self.runs.lock().unwrap().get(key).copied().unwrap_or(0)
    }
    pub(crate) fn total(&self) -> u32 {
        self.runs.lock().unwrap().values().sum()
    }
}

/// The handler: counts its run, then works without yielding for `stretch` at a time, yielding
/// between stretches, until the lab opens (or at once for a short key).
fn key_of<B>(req: &Request<B>) -> String {
    req.headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .trim_matches('"')
        .to_owned()
}

async fn handle(lab: Arc<Lab>, stretch: Duration, key: String) -> Response<Full<Bytes>> {
    let run = {
        let mut runs = lab.runs.lock().unwrap();
        let n = runs.entry(key.clone()).or_insert(0);
        *n += 1;
        *n
    };
    lab.started.fetch_add(1, Ordering::SeqCst);
    if run == 1 && lab.fail_first.lock().unwrap().contains(&key) {
        let mut res = Response::new(Full::new(Bytes::from_static(b"declined")));
        *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        return res;
    }
    let short = lab.short.lock().unwrap().contains(&key);
    if !short {
        while !lab.open.load(Ordering::SeqCst) {
            std::thread::sleep(stretch);
            tokio::task::yield_now().await;
        }
    }
    Response::new(Full::new(Bytes::from(format!("done {key}"))))
}

/// Serves the layer `make` returns (made on the server's runtime) over loopback from a
/// runtime of `flavour` on a thread of its own.
pub(crate) fn serve<St, F, Fut>(
    flavour: Flavour,
    lab: Arc<Lab>,
    stretch: Duration,
    make: F,
) -> (SocketAddr, Server)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = IdempotencyLayer<St>>,
    St: IdempotencyStore,
{
    serve_on(flavour, move || async move {
        let layer = make().await;
        layer.layer(tower::service_fn(move |req: Request<_>| {
            let lab = lab.clone();
            let key = key_of(&req);
            async move { Ok::<_, Infallible>(handle(lab, stretch, key).await) }
        }))
    })
}

pub(crate) type HttpClient =
    Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

pub(crate) fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A keyed POST: its status and whether it was a stored response (`idempotent-replayed`).
async fn post(client: &HttpClient, addr: SocketAddr, key: &str) -> (StatusCode, bool) {
    let req = Request::post(format!("http://{addr}/v1/writes"))
        .header("idempotency-key", format!("\"{key}\""))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{\"a\":1}")))
        .unwrap();
    // A guard against a hang, not a measure: a busy server thread answers in seconds.
    let res = tokio::time::timeout(Duration::from_secs(300), client.request(req))
        .await
        .expect("the server answers within five minutes")
        .expect("a response");
    let status = res.status();
    let stored = res.headers().get("idempotent-replayed").is_some();
    let _ = res.into_body().collect().await;
    (status, stored)
}

/// Sends every key at once; the statuses in the keys' order.
pub(crate) async fn post_all(
    client: &HttpClient,
    addrs: &[SocketAddr],
    keys: &[String],
) -> Vec<(StatusCode, bool)> {
    let mut tasks = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let (client, key, addr) = (client.clone(), key.clone(), addrs[i % addrs.len()]);
        tasks.push(tokio::spawn(async move { post(&client, addr, &key).await }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

pub(crate) async fn wait_started(lab: &Lab, n: usize) {
    for _ in 0..6000 {
        if lab.started.load(Ordering::SeqCst) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "only {} of {n} handlers started",
        lab.started.load(Ordering::SeqCst)
    );
}

/// How many of `answers` (status, stored) are 409s.
pub(crate) fn conflicts(answers: &[(StatusCode, bool)]) -> usize {
    answers
        .iter()
        .filter(|(s, _)| *s == StatusCode::CONFLICT)
        .count()
}

/// How many of `answers` are a fresh 200 (the handler's own, not a stored response).
pub(crate) fn fresh(answers: &[(StatusCode, bool)]) -> usize {
    answers
        .iter()
        .filter(|(s, r)| *s == StatusCode::OK && !r)
        .count()
}

/// How many of `answers` are a stored 200 (`idempotent-replayed`).
pub(crate) fn stored_responses(answers: &[(StatusCode, bool)]) -> usize {
    answers
        .iter()
        .filter(|(s, r)| *s == StatusCode::OK && *r)
        .count()
}

pub(crate) fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:04}")).collect()
}
