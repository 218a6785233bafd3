//! Either order of the deadline and idempotency layers frees the key of a request whose
//! caller had gone (issue 48, item 6): the deadline layer's answer is never stored as the
//! key's.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::util::BoxCloneService;
use tower::{service_fn, ServiceBuilder};
use tower_idempotency_keys::deadline::DeadlineLayer;
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};

use super::loopback::{send, serve, Ledger};

const MAX: Duration = Duration::from_secs(30);

fn counting<B: Send + 'static>(
    ledger: &Ledger,
) -> BoxCloneService<Request<B>, Response<Full<Bytes>>, Infallible> {
    let ledger = ledger.clone();
    BoxCloneService::new(service_fn(move |req: Request<B>| {
        ledger.record(&req);
        async { Ok(Response::new(Full::new(Bytes::from_static(b"done")))) }
    }))
}

fn keyed(addr: std::net::SocketAddr, timeout_ms: &str) -> Request<Full<Bytes>> {
    Request::post(format!("http://{addr}/work"))
        .header("idempotency-key", "\"k-late\"")
        .header("request-timeout-ms", timeout_ms)
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("request")
}

/// The first attempt arrives with its deadline passed (0 ms left): 504, nothing run; the
/// retry, in time, runs the handler once. Returns the retry's status, whether it was a
/// stored response, and the ledger's count.
async fn late_then_in_time(addr: std::net::SocketAddr, ledger: &Ledger) -> (StatusCode, bool, u32) {
    let (first, _) = send(keyed(addr, "0")).await;
    assert_eq!(
        first.status(),
        StatusCode::GATEWAY_TIMEOUT,
        "the late attempt"
    );
    assert_eq!(ledger.total(), 0, "the late attempt ran nothing");
    let (retry, _) = send(keyed(addr, "5000")).await;
    let stored = retry.headers().contains_key("idempotent-replayed");
    (retry.status(), stored, ledger.runs("\"k-late\""))
}

/// issue 48, item 6: the deadline layer outermost (the documented order): the retry runs
/// the handler once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_outside_idempotency_a_late_attempt_leaves_the_key_free() {
    let ledger = Ledger::default();
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(MAX))
        .layer(IdempotencyLayer::new(MemoryStore::new()))
        .service(counting(&ledger));
    let addr = serve(svc);
    assert_eq!(
        late_then_in_time(addr, &ledger).await,
        (StatusCode::OK, false, 1)
    );
}

/// issue 48, item 6: the deadline layer inside the idempotency layer: its 504 is not stored
/// as the key's answer; the key is freed and the retry runs the handler once. Before: the
/// retry got the stored 504 (`idempotent-replayed`), and the handler never ran (ledger 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_inside_idempotency_a_late_attempt_leaves_the_key_free() {
    let ledger = Ledger::default();
    let svc = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(MemoryStore::new()))
        .layer(DeadlineLayer::new(MAX))
        .service(counting(&ledger));
    let addr = serve(svc);
    assert_eq!(
        late_then_in_time(addr, &ledger).await,
        (StatusCode::OK, false, 1)
    );
}
