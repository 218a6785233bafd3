//! Exactly once past a crash, with a real process: a server in atomic mode (this test binary,
//! run again as a child: see `child_server`) is killed with SIGKILL at each point below, then
//! started again on the same port. The client sends the same key throughout. The server's
//! handler writes an order in the request's transaction and charges a provider (a server of
//! its own on loopback, honouring keys in lease mode) with the key derived from the
//! request's, through this crate's client layer.
//!
//! Points: after the handler's write and before the commit; after the provider's charge, its
//! response lost with the process; after the commit and before the response is written.
//! Each time: one order row, one charge applied, and the client ends with a success (the
//! stored response, or the clean re-run).

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::pg::{client, fresh, post, serve, TestDb};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use retry_safety_testing::ports::free_port;
use tokio::sync::mpsc;
use tower::{service_fn, BoxError, Service, ServiceBuilder, ServiceExt};
use tower_idempotency_keys::{
    stores::MemoryStore, stores::PostgresStore, IdempotencyLayer, KeyTransaction, RequestKey,
};
use tower_retry_safety::RetryPolicy;

type Req = Request<Either<Full<Bytes>, Incoming>>;

// ---- the child: a server in atomic mode that stops dead at a named point ----

/// Runs only as the child (when `TRS_PG_CHILD_SCHEMA` is set): serves until killed.
#[test]
fn child_server() {
    let Ok(schema) = std::env::var("TRS_PG_CHILD_SCHEMA") else {
        return;
    };
    let port: u16 = std::env::var("TRS_PG_CHILD_PORT").unwrap().parse().unwrap();
    let provider = std::env::var("TRS_PG_PROVIDER").unwrap();
    let crash_at = std::env::var("TRS_PG_CRASH_AT").ok();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(child(schema, port, provider, crash_at));
}

/// Says it reached `point` and waits there to be killed, if it is the crash point.
async fn point(crash_at: &Option<String>, point: &str) {
    if crash_at.as_deref() == Some(point) {
        println!("AT {point}");
        std::io::stdout().flush().unwrap();
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
}

type Outbound = tower_retry_safety::RetrySafety<
    tower::timeout::Timeout<
        hyper_util::client::legacy::Client<
            hyper_util::client::legacy::connect::HttpConnector,
            Full<Bytes>,
        >,
    >,
>;

async fn child_handler(
    crash: Arc<Option<String>>,
    outbound: Outbound,
    provider: String,
    req: Req,
) -> Result<Response<Full<Bytes>>, BoxError> {
    let key = req
        .extensions()
        .get::<RequestKey>()
        .cloned()
        .ok_or("no key")?;
    let tx = KeyTransaction::of(&req).cloned().ok_or("no transaction")?;
    let mut conn = tx.acquire().await?;
    let id: i64 =
        sqlx::query_scalar("INSERT INTO orders (key, note) VALUES ($1, 'x') RETURNING id")
            .bind(key.as_str())
            .fetch_one(&mut *conn)
            .await?;
    point(&crash, "after-write").await;
    let charge = Request::post(format!("http://{provider}/charge"))
        .header("idempotency-key", key.derive("charge").header_value())
        .body(Full::new(Bytes::from_static(b"5")))?;
    let charged = outbound.oneshot(charge).await?;
    if !charged.status().is_success() {
        return Err("the charge failed".into());
    }
    let receipt = charged.into_body().collect().await?.to_bytes();
    point(&crash, "after-provider").await;
    drop(conn);
    let mut res = Response::new(Full::new(Bytes::from(format!(
        "order {id}, {}",
        String::from_utf8_lossy(&receipt)
    ))));
    *res.status_mut() = StatusCode::CREATED;
    Ok(res)
}

async fn child(schema: String, port: u16, provider: String, crash_at: Option<String>) {
    let pool = crate::pg::pool_in(&crate::pg::database_url(), &schema, 8).await;
    let store = PostgresStore::from_pool(pool);
    store.migrate().await.unwrap();
    // The outbound client: this crate's retry layer, trusting the provider's keys.
    let policy = RetryPolicy::builder()
        .honor_idempotency_key_for_host("127.0.0.1")
        .max_retries(3)
        .no_budget()
        .build()
        .unwrap();
    let outbound = ServiceBuilder::new()
        .layer(policy)
        .timeout(Duration::from_secs(2))
        .service(client());
    let crash = Arc::new(crash_at);
    let handler = {
        let crash = crash.clone();
        service_fn(move |req: Req| {
            child_handler(crash.clone(), outbound.clone(), provider.clone(), req)
        })
    };
    let atomic = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store).atomic())
        .service(handler);
    // Outside the layer: the commit is done, the response not yet written.
    let svc = service_fn(move |req: Request<Incoming>| {
        let (mut atomic, crash) = (atomic.clone(), crash.clone());
        async move {
            let res: Result<_, BoxError> = atomic.call(req).await;
            if res.is_ok() {
                point(&crash, "after-commit").await;
            }
            res
        }
    });
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    println!("LISTENING");
    std::io::stdout().flush().unwrap();
    crate::pg::serve_on(listener, svc).await;
}

// ---- the parent ----

/// A child server process; killed (SIGKILL) when dropped.
struct ChildServer {
    process: std::process::Child,
    lines: mpsc::UnboundedReceiver<String>,
}

impl ChildServer {
    async fn start(db: &TestDb, port: u16, provider: SocketAddr, crash_at: Option<&str>) -> Self {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args([
                "crash::child_server",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("TRS_PG_CHILD_SCHEMA", &db.schema)
            .env("TRS_PG_CHILD_PORT", port.to_string())
            .env("TRS_PG_PROVIDER", provider.to_string())
            .env_remove("TRS_PG_CRASH_AT")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(at) = crash_at {
            command.env("TRS_PG_CRASH_AT", at);
        }
        let mut process = command.spawn().unwrap();
        let stdout = process.stdout.take().unwrap();
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut child = ChildServer { process, lines };
        child.wait_for("LISTENING").await;
        child
    }

    async fn wait_for(&mut self, expected: &str) {
        let found = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = self.lines.recv().await {
                if line.ends_with(expected) {
                    return true;
                }
            }
            false
        })
        .await;
        assert_eq!(found, Ok(true), "the child never said {expected:?}");
    }

    /// SIGKILL, by its pid.
    fn kill(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The provider: honours keys (lease mode, in memory), counts what its handler applied and
/// what reached it.
async fn provider() -> (SocketAddr, Arc<AtomicU32>, Arc<AtomicU32>) {
    let applied = Arc::new(AtomicU32::new(0));
    let reached = Arc::new(AtomicU32::new(0));
    let counted = applied.clone();
    let svc = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(MemoryStore::new()))
        .service(service_fn(move |_req: Req| {
            let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                Ok::<_, BoxError>(Response::new(Full::new(Bytes::from(format!("charge {n}")))))
            }
        }));
    let seen = reached.clone();
    let svc = service_fn(move |req: Request<Incoming>| {
        seen.fetch_add(1, Ordering::SeqCst);
        svc.clone().oneshot(req)
    });
    (serve(svc).await, applied, reached)
}

struct Outcome {
    /// The client's final answer: status, stored, body.
    last: (u16, bool, String),
    orders: i64,
    applied: u32,
    reached: u32,
}

/// The client sends one request with one key; the server is killed at `at` and started
/// again; the client sends the same key until it gets an answer other than 409 or 503.
async fn crash_at(at: &str) -> Outcome {
    let db = TestDb::new().await;
    let (provider, applied, reached) = provider().await;
    // Below the ephemeral range: while the killed server is down, no port-0 listener of
    // another test takes its port before it starts again there.
    let port = free_port();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let key = fresh("crash");
    let mut first_life = ChildServer::start(&db, port, provider, Some(at)).await;
    let first = {
        let key = key.clone();
        tokio::spawn(async move { post(&client(), addr, "/orders", &key, "x").await })
    };
    first_life.wait_for(&format!("AT {at}")).await;
    first_life.kill();
    assert!(
        first.await.unwrap().is_err(),
        "the first attempt ends without an answer"
    );
    let _second_life = ChildServer::start(&db, port, provider, None).await;
    let mut last = None;
    for _ in 0..100 {
        match post(&client(), addr, "/orders", &key, "x").await {
            Ok((409 | 503, _, _)) | Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            Ok(answer) => {
                last = Some(answer);
                break;
            }
        }
    }
    let orders = db
        .count(&format!("SELECT count(*) FROM orders WHERE key = '{key}'"))
        .await;
    Outcome {
        last: last.expect("an answer after the restart"),
        orders,
        applied: applied.load(Ordering::SeqCst),
        reached: reached.load(Ordering::SeqCst),
    }
}

#[tokio::test]
async fn killed_after_the_write_before_the_commit_runs_again_on_a_clean_slate() {
    let out = crash_at("after-write").await;
    assert_eq!((out.last.0, out.last.1), (201, false), "the clean re-run");
    assert_eq!(out.orders, 1);
    assert_eq!((out.applied, out.reached), (1, 1));
}

#[tokio::test]
async fn killed_after_the_providers_charge_runs_again_and_the_provider_answers_from_its_store() {
    let out = crash_at("after-provider").await;
    assert_eq!((out.last.0, out.last.1), (201, false), "the clean re-run");
    assert!(out.last.2.ends_with("charge 1"), "{}", out.last.2);
    assert_eq!(out.orders, 1);
    assert_eq!(out.applied, 1, "the provider applied the charge once");
    assert_eq!(
        out.reached, 2,
        "the re-run's charge reached the provider, answered from its store"
    );
}

#[tokio::test]
async fn killed_after_the_commit_before_the_response_gets_the_stored_response() {
    let out = crash_at("after-commit").await;
    assert_eq!((out.last.0, out.last.1), (201, true), "the stored response");
    assert!(out.last.2.ends_with("charge 1"), "{}", out.last.2);
    assert_eq!(out.orders, 1);
    assert_eq!((out.applied, out.reached), (1, 1));
}
