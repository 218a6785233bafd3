//! Exactly once across a fleet: two server instances share one Redis through `RedisStore`,
//! behind a forwarder that sends an operation's consecutive attempts to different instances.
//! The client mints keys and times attempts out; side effects are counted across the fleet.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use retry_safety_testing::fleet::{forwarder, Counts, Fault, Instance};
use retry_safety_testing::redis::OwnRedis;
use retry_safety_testing::redis::TestRedis;
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency_keys::{stores::RedisStore, Entry, IdempotencyStore};
use tower_retry_safety::{RetryPolicy, RetryReport};

const PER_ATTEMPT: Duration = Duration::from_millis(400);
const OPS_PER_FAULT: usize = 4;

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Retries that outlast a slow handler: 409s ask for 1 s, ten of them are allowed.
fn patient() -> RetryPolicy {
    RetryPolicy::builder()
        .mint_idempotency_keys(true)
        .max_retries(10)
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        .no_budget()
        .build()
        .unwrap()
}

fn post(url: String, fault: Fault) -> Request<Full<Bytes>> {
    Request::post(url)
        .header("x-fault", fault.name())
        .body(Full::new(Bytes::from_static(b"{\"to\":\"a@example.com\"}")))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fault_on_either_instance_applies_each_write_once() {
    let counts = Counts::default();
    let redis = TestRedis::start("faults");
    let prefix = redis.prefix().to_owned();
    let mut a = Instance::start(redis.url(), &prefix, counts.clone()).await;
    let b = Instance::start(redis.url(), &prefix, counts.clone()).await;
    let front = forwarder(vec![a.addr, b.addr]).await;
    let svc = ServiceBuilder::new()
        .layer(patient())
        .timeout(PER_ATTEMPT)
        .service(client());

    let mut tasks = tokio::task::JoinSet::new();
    for fault in Fault::RECOVERABLE {
        for i in 0..OPS_PER_FAULT {
            let op = format!("{}-{i}", fault.name());
            let (svc, url) = (svc.clone(), format!("http://{front}/{op}"));
            tasks.spawn(async move { (op, svc.oneshot(post(url, fault)).await) });
        }
    }
    let mut writes = 0;
    while let Some(done) = tasks.join_next().await {
        let (op, res) = done.unwrap();
        let res = res.unwrap_or_else(|e| panic!("{op}: {e}"));
        assert_eq!(res.status(), StatusCode::OK, "{op}");
        assert!(res.extensions().get::<RetryReport>().is_some());
        writes += 1;
    }
    for fault in Fault::RECOVERABLE {
        for i in 0..OPS_PER_FAULT {
            let op = format!("{}-{i}", fault.name());
            // Faults before apply are retried into one run; faults after apply answered from the
            // store.
            assert_eq!(counts.applied(&op), 1, "{op}");
        }
    }
    println!(
        "fleet: writes {writes}, succeeded {writes}, applied twice {}, applied {}",
        counts.applied_twice(),
        counts.total_applied()
    );
    assert_eq!(counts.applied_twice(), 0);
    // The slow handler outlived its lease (LEASE < SLOW_HANDLER): only renewal kept its claim.

    // An instance stopped in the middle of a handler, after it applied: its claim holds the
    // key until its lease ends, so the other instance answers 409 and runs nothing; a client
    // whose retries end within the lease ends with that 409. (After the lease, a repeat of the
    // key would run the handler again: the lease is the window in which a crashed server's
    // write cannot be told from one that never started.)
    let op = "instance-stopped-0";
    let brief = RetryPolicy::builder()
        .mint_idempotency_keys(true)
        .max_retries(1)
        .backoff(Duration::from_millis(20), Duration::from_millis(20))
        .no_budget()
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(brief)
        .timeout(PER_ATTEMPT)
        .service(client());
    let url = format!("http://{front}/{op}");
    let sent = tokio::spawn(svc.oneshot(post(url, Fault::InstanceStoppedAfterApply)));
    counts.stop_requested().await;
    a.stop();
    let res = sent.await.unwrap().unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(counts.applied(op), 1);
    let report = res.extensions().get::<RetryReport>().unwrap();
    let key = report.idempotency_key().unwrap().to_owned();
    let store = RedisStore::connect(redis.url())
        .await
        .unwrap()
        .prefix(prefix);
    assert!(matches!(
        store.get(&key).await.unwrap(),
        Some(Entry::InFlight { .. })
    ));
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_requests_with_one_key_run_once() {
    let counts = Counts::default();
    let redis = TestRedis::start("same-key");
    let prefix = redis.prefix().to_owned();
    let a = Instance::start(redis.url(), &prefix, counts.clone()).await;
    let b = Instance::start(redis.url(), &prefix, counts.clone()).await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..64u32 {
        let addr = if i.is_multiple_of(2) { a.addr } else { b.addr };
        tasks.spawn(async move {
            let req = Request::post(format!("http://{addr}/same"))
                .header("idempotency-key", "\"k-64\"")
                .header("x-fault", Fault::SlowAfterApply.name())
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap();
            client().request(req).await.map(|r| r.status())
        });
    }
    let (mut ok, mut conflict) = (0, 0);
    while let Some(done) = tasks.join_next().await {
        match done.unwrap().unwrap() {
            StatusCode::OK => ok += 1,
            StatusCode::CONFLICT => conflict += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(counts.applied("same"), 1);
    assert_eq!(ok + conflict, 64);
    assert!(ok >= 1, "the one that ran answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_answers_503_and_runs_nothing_until_it_is_back() {
    let mut redis = OwnRedis::start();
    let counts = Counts::default();
    let a = Instance::start(&redis.url(), "fleet:", counts.clone()).await;
    let b = Instance::start(&redis.url(), "fleet:", counts.clone()).await;
    let keyed = |addr, op: &str, key: &str| {
        Request::post(format!("http://{addr}/{op}"))
            .header("idempotency-key", format!("\"{key}\""))
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap()
    };
    for (i, addr) in [a.addr, b.addr].into_iter().enumerate() {
        let res = client()
            .request(keyed(
                addr,
                &format!("before-{i}"),
                &format!("k-before-{i}"),
            ))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }

    redis.stop();
    for (i, addr) in [a.addr, b.addr].into_iter().enumerate() {
        let res = client()
            .request(keyed(
                addr,
                &format!("during-{i}"),
                &format!("k-during-{i}"),
            ))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(res.headers().contains_key("retry-after"));
        assert_eq!(
            counts.applied(&format!("during-{i}")),
            0,
            "nothing runs without the store"
        );
    }

    redis.start_again();
    for (i, addr) in [a.addr, b.addr].into_iter().enumerate() {
        // The connection comes back on its own; the first call may still see it down.
        let mut status = StatusCode::SERVICE_UNAVAILABLE;
        for _ in 0..50 {
            let res = client()
                .request(keyed(addr, &format!("after-{i}"), &format!("k-after-{i}")))
                .await
                .unwrap();
            status = res.status();
            if status != StatusCode::SERVICE_UNAVAILABLE {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            status,
            StatusCode::OK,
            "instance {i} serves again without a restart"
        );
        assert_eq!(counts.applied(&format!("after-{i}")), 1);
    }
}

/// A handler busy past its lease without yielding (a blocking call before its first await:
/// no renewal can run) on a real Redis and real sockets: its lease lapses while no one else
/// holds the key, and its outcome is still stored, so a repeat gets the stored response instead of
/// running it again. Before `complete` accepted a lapsed claim, the repeat ran it twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_busy_past_its_lease_without_yielding_runs_once() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use tower_idempotency_keys::IdempotencyLayer;

    let redis = TestRedis::start("busy");
    let store = RedisStore::connect(redis.url())
        .await
        .unwrap()
        .prefix(redis.prefix());
    let runs = Arc::new(AtomicU32::new(0));
    let counted = runs.clone();
    let layer = IdempotencyLayer::new(store).lease(Duration::from_millis(100));
    let handler = tower::service_fn(move |_req: Request<_>| {
        let runs = counted.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            // Three leases without an await.
            std::thread::sleep(Duration::from_millis(300));
            Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from_static(
                b"sent",
            ))))
        }
    });
    let svc = tower::Layer::layer(&layer, handler);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let svc = svc.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    svc.clone().oneshot(req)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    let send = || {
        Request::post(format!("http://{addr}/v1/messages"))
            .header("idempotency-key", "\"busy-1\"")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap()
    };
    let first = client().request(send()).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let again = client().request(send()).await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(
        again
            .headers()
            .get("idempotent-replayed")
            .map(|v| v.as_bytes()),
        Some(&b"true"[..]),
        "the repeat ran the handler again"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
