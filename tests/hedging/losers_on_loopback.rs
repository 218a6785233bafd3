//! The attempts that lose to a hedge, against real servers on 127.0.0.1 (the adversarial
//! review of safe hedging and the per-attempt spans, issue 25): a hedged read whose body is
//! cut is not the answer, losers leave no streams or connections behind on HTTP/1 and HTTP/2,
//! and a middleware inside the reqwest adapter sees each attempt's number. These attacks held.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retry_safety_testing::fault_server::{Fault, FaultServer};
use retry_safety_testing::hedging_stacks::{Guard, HttpClient};
use tower::{Layer, Service, ServiceExt};
use tower_retry_safety::service::attempt_number;
use tower_retry_safety::{Hedge, RetryPolicy, RetryReport};

/// Hedging with `ReadWholeLayer` inside: the hedge's body is cut after its first frame (a
/// success whose body a reading layer found cut is ambiguous), so the next attempt goes at
/// once while the first keeps running; the first, whole, wins. The caller reads the whole,
/// right representation, never the cut one.
///
/// Found by the adversarial review of safe hedging and the per-attempt spans (issue 25).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedged_read_whose_body_is_cut_is_not_the_answer() {
    use retry_safety_testing::cut_server::{Cut, CutServer, Options};
    use retry_safety_testing::read_whole::{read_all, representation, stack};
    let body = representation(16 * 1024);
    let mut options = Options::new(body.clone());
    options.ranges = false;
    options.etag = false;
    options.frame = 4096;
    options.pace = Some(Duration::from_millis(60));
    let server = CutServer::start(options, vec![Cut::None, Cut::At(4096)]).await;
    let policy = RetryPolicy::builder()
        .hedge(Hedge::fixed(Duration::from_millis(20)).max_extra_load(1.0))
        .max_retries(3)
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .no_budget()
        .build()
        .unwrap();
    let req = Request::get(server.url("/file"))
        .body(Full::default())
        .unwrap();
    let res = stack(policy).oneshot(req).await.expect("recovered");
    let r = RetryReport::of(&res).expect("report").clone();
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(bytes, body);
    assert_eq!(server.requests(), 3, "{r}");
    assert_eq!(
        (r.hedges(), r.won_by(), r.superseded()),
        (1, Some(1), 1),
        "{r}"
    );
    let cut = r.attempt_outcomes().next().unwrap();
    assert_eq!(cut.status(), Some(StatusCode::OK));
    assert_eq!(cut.class(), tower_retry_safety::FailureClass::Ambiguous);
}

/// A loopback server that counts live connections and handler futures dropped before they
/// finished (a reset stream on HTTP/2); the first request to each path takes 300 ms.
struct ConnServer {
    addr: std::net::SocketAddr,
    live: Arc<AtomicU32>,
    cancelled: Arc<AtomicU32>,
    requests: Arc<AtomicU32>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ConnServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn conn_server() -> ConnServer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let live = Arc::new(AtomicU32::new(0));
    let cancelled = Arc::new(AtomicU32::new(0));
    let requests = Arc::new(AtomicU32::new(0));
    let seen = Arc::new(Mutex::new(std::collections::HashSet::<String>::new()));
    let (l, c, q) = (live.clone(), cancelled.clone(), requests.clone());
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (l, c, q, seen) = (l.clone(), c.clone(), q.clone(), seen.clone());
            l.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    q.fetch_add(1, Ordering::SeqCst);
                    let first = seen.lock().unwrap().insert(req.uri().path().to_owned());
                    let guard = Guard {
                        done: false,
                        cancelled: c.clone(),
                    };
                    async move {
                        let mut guard = guard;
                        if first {
                            tokio::time::sleep(Duration::from_millis(300)).await;
                        }
                        guard.done = true;
                        Ok::<_, std::io::Error>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
                l.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    ConnServer {
        addr,
        live,
        cancelled,
        requests,
        task,
    }
}

/// Waits (at most 5 s) until `f` holds; whether it did.
async fn eventually(f: impl Fn() -> bool) -> bool {
    for _ in 0..100 {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    f()
}

/// Losers on HTTP/1 and HTTP/2: 10 hedged reads, each won by the hedge. On HTTP/2 every
/// loser's stream is reset (its handler future dropped on the server) and one connection
/// stays; on HTTP/1 the losers' connections are closed, so live connections fall back to
/// the pool's few rather than growing by one per loser.
///
/// Found by the adversarial review of safe hedging and the per-attempt spans (issue 25).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losers_leave_no_streams_or_connections_behind() {
    for h2 in [false, true] {
        let server = conn_server().await;
        let mut builder = Client::builder(TokioExecutor::new());
        builder.http2_only(h2);
        let client: HttpClient = builder.build_http();
        let policy = RetryPolicy::builder()
            .hedge(Hedge::fixed(Duration::from_millis(20)).max_extra_load(1.0))
            .no_budget()
            .build()
            .unwrap();
        let mut svc = policy.layer(client);
        for i in 0..10 {
            let req = Request::get(format!("http://{}/r{i}", server.addr))
                .body(Full::default())
                .unwrap();
            let res = svc.ready().await.unwrap().call(req).await.unwrap();
            let r = RetryReport::of(&res).cloned().unwrap();
            assert_eq!(
                (r.hedges(), r.won_by(), r.superseded()),
                (1, Some(2), 1),
                "h2 {h2}"
            );
            assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), "ok");
        }
        assert_eq!(server.requests.load(Ordering::SeqCst), 20);
        if h2 {
            let c = server.cancelled.clone();
            assert!(
                eventually(|| c.load(Ordering::SeqCst) == 10).await,
                "h2: {} reset",
                c.load(Ordering::SeqCst)
            );
        }
        let live = server.live.clone();
        let max = if h2 { 1 } else { 2 };
        assert!(
            eventually(|| live.load(Ordering::SeqCst) <= max).await,
            "h2 {h2}: {} connections still open",
            live.load(Ordering::SeqCst)
        );
    }
}

/// Records `attempt_number` as a middleware further in sees it.
struct Numbers(Arc<Mutex<Vec<Option<u32>>>>);

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for Numbers {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut http::Extensions,
        next: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        self.0.lock().unwrap().push(attempt_number(extensions));
        next.run(req, extensions).await
    }
}

/// Through the reqwest adapter, a middleware further in sees each attempt's number, the
/// hedge's included; the hedge wins and the loser is superseded.
///
/// Found by the adversarial review of safe hedging and the per-attempt spans (issue 25).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reqwest_inner_middleware_sees_the_hedge_number() {
    use tower_retry_safety::RetrySafetyMiddleware;
    let server = FaultServer::start().await;
    let policy = RetryPolicy::builder()
        .hedge(Hedge::fixed(Duration::from_millis(20)).max_extra_load(1.0))
        .no_budget()
        .build()
        .unwrap();
    let numbers = Arc::new(Mutex::new(Vec::new()));
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetrySafetyMiddleware::new(policy))
        .with(Numbers(numbers.clone()))
        .build();
    let res = client
        .get(server.url("numbered"))
        .header("x-fault", Fault::SlowAfterApply.name())
        .send()
        .await
        .unwrap();
    let r = RetryReport::of_reqwest(&res).unwrap().clone();
    assert_eq!((r.hedges(), r.won_by(), r.superseded()), (1, Some(2), 1));
    assert_eq!(*numbers.lock().unwrap(), [Some(1), Some(2)]);
    assert_eq!(server.stats("numbered").attempts, 2);
}
