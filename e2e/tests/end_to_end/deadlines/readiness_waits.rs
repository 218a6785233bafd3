//! A wait for readiness inside the stack counts against the caller's deadline (issue 48,
//! item 3): `DeadlineLayer` → (`IdempotencyLayer` →) `ConcurrencyLimit(1)` → handler over
//! real sockets, with a first request holding the only permit until the test lets it go.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::sync::{Notify, Semaphore};
use tower::limit::ConcurrencyLimitLayer;
use tower::util::BoxCloneService;
use tower::{service_fn, ServiceBuilder};
use tower_idempotency_keys::deadline::DeadlineLayer;
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};

use super::loopback::{send, serve, Ledger};

const MAX: Duration = Duration::from_secs(30);
/// How long the test waits for the queued callers' answers while the permit is held: a
/// bound, never a measure (they are due 100 ms after they arrive).
const BOUND: Duration = Duration::from_secs(10);
const QUEUED: usize = 3;

/// The handler: counts its calls; the request keyed `blocker` holds its permit until `gate`
/// opens.
struct Blocked {
    ledger: Ledger,
    started: Arc<Notify>,
    gate: Arc<Semaphore>,
}

fn blocked() -> Blocked {
    Blocked {
        ledger: Ledger::default(),
        started: Arc::new(Notify::new()),
        gate: Arc::new(Semaphore::new(0)),
    }
}

fn handler<B: Send + 'static>(
    b: &Blocked,
) -> BoxCloneService<Request<B>, Response<Full<Bytes>>, Infallible> {
    let (ledger, started, gate) = (b.ledger.clone(), b.started.clone(), b.gate.clone());
    BoxCloneService::new(service_fn(move |req: Request<B>| {
        ledger.record(&req);
        let blocker = req.headers().get("x-blocker").is_some();
        let (started, gate) = (started.clone(), gate.clone());
        async move {
            if blocker {
                started.notify_one();
                let _ = gate.acquire().await;
            }
            Ok(Response::new(Full::new(Bytes::from_static(b"done"))))
        }
    }))
}

fn request(
    addr: std::net::SocketAddr,
    key: Option<&str>,
    timeout_ms: Option<u32>,
) -> Request<Full<Bytes>> {
    let mut req = Request::post(format!("http://{addr}/work"));
    if let Some(key) = key {
        req = req.header("idempotency-key", format!("\"{key}\""));
    }
    if let Some(ms) = timeout_ms {
        req = req.header("request-timeout-ms", ms.to_string());
    }
    req.body(Full::new(Bytes::from_static(b"{}")))
        .expect("request")
}

/// Runs the scenario: the blocker takes the permit, `QUEUED` requests with a 100 ms deadline
/// queue behind it; their answers are awaited (within `BOUND`) while the permit is held, then
/// the blocker is let go. Returns the queued answers' statuses and whether they came while
/// the permit was held.
async fn queue_behind_the_blocker(
    addr: std::net::SocketAddr,
    b: &Blocked,
    keyed: bool,
) -> (Vec<StatusCode>, bool) {
    let mut blocker = request(addr, keyed.then_some("blocker"), None);
    blocker
        .headers_mut()
        .insert("x-blocker", "1".parse().expect("value"));
    let started = b.started.notified();
    let blocker = tokio::spawn(send(blocker));
    tokio::time::timeout(BOUND, started)
        .await
        .expect("the blocker reached its handler");
    let queued: Vec<_> = (0..QUEUED)
        .map(|i| {
            let key = format!("k-{i}");
            tokio::spawn(send(request(
                addr,
                keyed.then_some(key.as_str()),
                Some(100),
            )))
        })
        .collect();
    let all = futures_util::future::join_all(queued);
    let mut all = std::pin::pin!(all);
    let while_held = tokio::time::timeout(BOUND, &mut all).await;
    let answered_while_held = while_held.is_ok();
    b.gate.add_permits(1);
    let answers = match while_held {
        Ok(answers) => answers,
        Err(_) => all.await,
    };
    let (res, _) = blocker.await.expect("blocker task");
    assert_eq!(res.status(), StatusCode::OK, "the blocker");
    let statuses = answers
        .into_iter()
        .map(|a| a.expect("queued task").0.status())
        .collect();
    (statuses, answered_while_held)
}

/// issue 48, item 3: keyed writes with a 100 ms deadline queued behind another request's
/// permit are answered 504 at their deadline, while the permit is still held, and never run;
/// each key is free, and its retry in time runs it once. Before: no answer came in the 10 s
/// the permit was held (the deadline layer's clock started after the wait), and all 3 ran
/// and answered 200 once it was let go, long after their callers had gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_write_queued_past_its_deadline_is_answered_then_and_never_runs() {
    let b = blocked();
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(MAX))
        .layer(IdempotencyLayer::new(MemoryStore::new()))
        .layer(ConcurrencyLimitLayer::new(1))
        .service(handler(&b));
    let addr = serve(svc);
    let (statuses, while_held) = queue_behind_the_blocker(addr, &b, true).await;
    let late: u32 = (0..QUEUED)
        .map(|i| b.ledger.runs(&format!("\"k-{i}\"")))
        .sum();
    assert_eq!(
        (while_held, late),
        (true, 0),
        "answered while the permit was held; queued handlers that ran after their callers had gone ({statuses:?})"
    );
    assert!(
        statuses.iter().all(|s| *s == StatusCode::GATEWAY_TIMEOUT),
        "{statuses:?}"
    );
    for i in 0..QUEUED {
        let (res, _) = send(request(addr, Some(&format!("k-{i}")), Some(5_000))).await;
        assert_eq!(res.status(), StatusCode::OK, "k-{i}'s retry");
        assert!(
            res.headers().get("idempotent-replayed").is_none(),
            "k-{i} ran"
        );
        assert_eq!(b.ledger.runs(&format!("\"k-{i}\"")), 1, "k-{i}");
    }
}

/// issue 48, item 3: the same for requests without a key behind `ConcurrencyLimit(1)` with no
/// idempotency layer: answered 504 at their deadline, never run. Before: no answer while
/// the permit was held, then all 3 ran (4 handler calls with the blocker's) and answered 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unkeyed_request_queued_past_its_deadline_is_answered_then_and_never_runs() {
    let b = blocked();
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(MAX))
        .layer(ConcurrencyLimitLayer::new(1))
        .service(handler(&b));
    let addr = serve(svc);
    let (statuses, while_held) = queue_behind_the_blocker(addr, &b, false).await;
    assert_eq!(
        (while_held, b.ledger.total()),
        (true, 1),
        "answered while the permit was held; handler calls, the blocker's included ({statuses:?})"
    );
    assert!(
        statuses.iter().all(|s| *s == StatusCode::GATEWAY_TIMEOUT),
        "{statuses:?}"
    );
}
