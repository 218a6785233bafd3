//! The tour: the same faulty workload through a typical retry stack and through this layer.
//!
//! A hyper server on 127.0.0.1 counts side effects per operation and injects one fault into
//! each operation's first attempt: ok, response lost after the write was applied, slow response
//! after apply, 503 after apply, 429 before apply, 500 before apply. 120 writes (POST) and 120
//! reads (GET), each stack against a fresh server. Two rows hedge: tower's `hedge` with a
//! policy that clones every request, and this crate's `Hedge`, which never hedges a write.
//!
//! Then reads whose body is cut mid-way: 120 GETs per stack, half of 16 KiB and half of 1 MiB,
//! from a server that supports `Range` and sends a strong ETag. Half of the GETs get their
//! first response cut, right after the head or half-way through the body.
//!
//! Run: `cargo run --example tour`. The `RetrySafetyMiddleware` row needs the crate's
//! `reqwest-middleware` feature: in this repository the crate is its own dev-dependency with
//! that feature, so examples always have it (a published copy drops that dev-dependency and
//! needs `--features reqwest-middleware`).

#[path = "../tests/support/cut_server.rs"]
mod cut_server;
#[path = "../tests/support/fault_server.rs"]
mod fault_server;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fault_server::{Fault, FaultServer};
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::retry::Policy;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_idempotency_keys::{IdempotencyLayer, MemoryStore};
use tower_retry_safety::{Hedge, RetryPolicy};

const OPS_PER_FAULT: usize = 20;
const PER_ATTEMPT: Duration = Duration::from_millis(250);
/// GETs per body size in the cut-body table.
const CUT_OPS_PER_SIZE: usize = 60;

type Req = Request<Full<Bytes>>;
type BoxFut = Pin<Box<dyn Future<Output = Option<u16>> + Send>>;
/// Sends one request; the status it ended with, or `None` for an error.
type Sender = Arc<dyn Fn(Method, String, Fault) -> BoxFut + Send + Sync>;

fn request(method: Method, url: &str, fault: Fault) -> Req {
    Request::builder()
        .method(method)
        .uri(url)
        .header("x-fault", fault.name())
        .body(Full::new(Bytes::from_static(b"{\"to\":\"a@example.com\"}")))
        .expect("valid request")
}

/// The retry policy people typically write for tower::retry: retry errors, 5xx and 429, up
/// to 3 times, with a short pause.
#[derive(Clone)]
struct TypicalPolicy {
    left: u32,
}

impl Policy<Req, Response<Incoming>, BoxError> for TypicalPolicy {
    type Future = Pin<Box<tokio::time::Sleep>>;

    fn retry(
        &mut self,
        _req: &mut Req,
        result: &mut Result<Response<Incoming>, BoxError>,
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

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        let mut copy = Request::new(req.body().clone());
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        *copy.headers_mut() = req.headers().clone();
        Some(copy)
    }
}

/// tower's `hedge` with the policy its docs suggest for any request: clone it.
#[derive(Clone)]
struct HedgeAll;

impl tower::hedge::Policy<Req> for HedgeAll {
    fn clone_request(&self, req: &Req) -> Option<Req> {
        let mut copy = Request::new(req.body().clone());
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        *copy.headers_mut() = req.headers().clone();
        Some(copy)
    }

    fn can_retry(&self, _req: &Req) -> bool {
        true
    }
}

/// Wraps any tower stack over hyper-util's client as a `Sender`.
fn tower_sender<S, E>(svc: S) -> Sender
where
    S: Service<Req, Response = Response<Incoming>, Error = E> + Clone + Send + Sync + 'static,
    S::Future: Send,
    E: Send + 'static,
{
    Arc::new(move |method, url, fault| {
        let svc = svc.clone();
        Box::pin(async move {
            let res = svc.oneshot(request(method, &url, fault)).await.ok()?;
            let status = res.status().as_u16();
            res.into_body().collect().await.ok()?;
            Some(status)
        })
    })
}

fn reqwest_sender(client: reqwest_middleware::ClientWithMiddleware) -> Sender {
    Arc::new(move |method, url, fault| {
        let client = client.clone();
        Box::pin(async move {
            let res = client
                .request(method, url)
                .header("x-fault", fault.name())
                .body("{\"to\":\"a@example.com\"}")
                .send()
                .await
                .ok()?;
            let status = res.status().as_u16();
            res.bytes().await.ok()?;
            Some(status)
        })
    })
}

struct Row {
    name: &'static str,
    applied_twice: usize,
    reads_recovered: usize,
    writes_ok: usize,
    attempts: u32,
}

async fn run(name: &'static str, send: Sender) -> Row {
    run_against(name, send, FaultServer::start().await).await
}

async fn run_against(name: &'static str, send: Sender, server: FaultServer) -> Row {
    let mut tasks = tokio::task::JoinSet::new();
    for (i, fault) in Fault::ALL
        .into_iter()
        .flat_map(|f| std::iter::repeat_n(f, OPS_PER_FAULT))
        .enumerate()
    {
        for method in [Method::POST, Method::GET] {
            let url = server.url(&format!("{}-{i}", method.as_str().to_lowercase()));
            let send = send.clone();
            tasks.spawn(async move { (method.clone(), send(method, url, fault).await) });
        }
    }
    let (mut reads_recovered, mut writes_ok) = (0, 0);
    while let Some(done) = tasks.join_next().await {
        match done.expect("no panic") {
            (Method::GET, Some(200)) => reads_recovered += 1,
            (Method::POST, Some(200)) => writes_ok += 1,
            _ => {}
        }
    }
    Row {
        name,
        applied_twice: server.applied_twice(),
        reads_recovered,
        writes_ok,
        attempts: server.total_attempts(),
    }
}

/// Sends one GET with `x-cut-first` (the server cuts the path's first response after that
/// many bytes of body, if `Some`); the body the caller read whole, or `None`.
type GetSender = Arc<dyn Fn(String, Option<usize>) -> GetFut + Send + Sync>;
type GetFut = Pin<Box<dyn Future<Output = Option<Bytes>> + Send>>;

fn tower_get<S, B, E>(svc: S) -> GetSender
where
    S: Service<Req, Response = Response<B>, Error = E> + Clone + Send + Sync + 'static,
    S::Future: Send,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    E: Send + 'static,
{
    Arc::new(move |url, cut| {
        let svc = svc.clone();
        Box::pin(async move {
            let mut req = Request::get(url);
            if let Some(cut) = cut {
                req = req.header("x-cut-first", cut);
            }
            let req = req.body(Full::default()).expect("valid request");
            let res = svc.oneshot(req).await.ok()?;
            Some(res.into_body().collect().await.ok()?.to_bytes())
        })
    })
}

fn reqwest_get(client: reqwest_middleware::ClientWithMiddleware) -> GetSender {
    Arc::new(move |url, cut| {
        let client = client.clone();
        Box::pin(async move {
            let mut req = client.get(url);
            if let Some(cut) = cut {
                req = req.header("x-cut-first", cut);
            }
            req.send().await.ok()?.bytes().await.ok()
        })
    })
}

/// Cut reads recovered (the caller got the whole body), of those cut.
async fn cut_reads(send: GetSender) -> usize {
    let mut recovered = 0;
    for size in [16 * 1024, 1024 * 1024] {
        let body: Bytes = (0..size)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<u8>>()
            .into();
        let options = cut_server::Options::new(body.clone());
        let server = cut_server::CutServer::start(options, Vec::new()).await;
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..CUT_OPS_PER_SIZE {
            // A quarter cut right after the head, a quarter half-way, half whole.
            let cut = match i % 4 {
                0 => Some(0),
                1 => Some(size / 2),
                _ => None,
            };
            let url = server.url(&format!("/files/{i}"));
            let send = send.clone();
            tasks.spawn(async move { (cut.is_some(), send(url, cut).await) });
        }
        while let Some(done) = tasks.join_next().await {
            if let (true, Some(got)) = done.expect("no panic") {
                recovered += usize::from(got == body);
            }
        }
    }
    recovered
}

/// One suppressed write, as a caller sees it.
async fn show_suppressed_error() -> Result<(), Box<dyn std::error::Error>> {
    let server = FaultServer::start().await;
    let svc = ServiceBuilder::new()
        .layer(RetryPolicy::builder().build()?)
        .timeout(PER_ATTEMPT)
        .service(Client::builder(TokioExecutor::new()).build_http());
    let url = format!(
        "http://{}/v1/tools/execute/GMAIL_SEND_EMAIL?api_key=sk-not-printed",
        server.addr()
    );
    let req = Request::post(url)
        .header("x-fault", Fault::SlowAfterApply.name())
        .header("x-request-id", "req-7f3a")
        .header(
            "idempotency-key",
            "\"3f9c2b1e-5d4a-4e8b-9c7d-1a2b3c4d5e6f\"",
        )
        .body(Full::new(Bytes::from_static(b"{\"to\":\"a@example.com\"}")))?;
    let Err(err) = svc.oneshot(req).await else {
        return Err("expected the slow write to fail".into());
    };
    println!("\nOne suppressed write, as the caller sees it. This example sent it with");
    println!("`x-request-id: req-7f3a` and `Idempotency-Key: \"3f9c2b1e-...\"` (both set by");
    println!("the example itself, as an SDK would), to a server that applies it and answers");
    println!(
        "too late for the client's {} ms per-attempt timeout:\n",
        PER_ATTEMPT.as_millis()
    );
    println!("  {err}\n");
    println!("  is_ambiguous()      {}", err.is_ambiguous());
    println!("  retry_suppressed()  {}", err.retry_suppressed());
    println!("  attempts()          {}", err.attempts());
    println!("  stop_reason()       {:?}", err.stop_reason());
    println!(
        "  request_id()        {:?} (set by this example)",
        err.request_id()
    );
    println!(
        "  idempotency_key()   {:?} (set by this example)",
        err.idempotency_key()
    );
    if let (Some(first), Some(last)) = (err.first_attempt_at(), err.last_attempt_at()) {
        println!("  first_attempt_at()  {}", httpdate::fmt_http_date(first));
        println!("  last_attempt_at()   {}", httpdate::fmt_http_date(last));
    }
    println!("  crate_version()     {}", err.crate_version());
    let mut source = std::error::Error::source(&err);
    while let Some(cause) = source {
        println!("  caused by           {cause}");
        source = cause.source();
    }
    println!(
        "  side effects applied on the server: {} (sent once, not twice)",
        server.applied("/v1/tools/execute/GMAIL_SEND_EMAIL")
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = || Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let reqwest_client = || {
        reqwest::Client::builder()
            .timeout(PER_ATTEMPT)
            .build()
            .expect("a plain http client")
    };
    let total = OPS_PER_FAULT * Fault::ALL.len();
    let mut rows = Vec::new();

    let bare = ServiceBuilder::new().timeout(PER_ATTEMPT).service(client());
    rows.push(run("no retry", tower_sender(bare)).await);

    let typical = ServiceBuilder::new()
        .retry(TypicalPolicy { left: 3 })
        .timeout(PER_ATTEMPT)
        .service(client());
    rows.push(run("tower::retry, typical policy", tower_sender(typical)).await);

    // reqwest 0.13's own default retries, nothing added.
    let plain = reqwest_middleware::ClientBuilder::new(reqwest_client()).build();
    rows.push(run("reqwest 0.13, built-in default", reqwest_sender(plain)).await);

    let retry_policy =
        reqwest_retry::policies::ExponentialBackoff::builder().build_with_max_retries(3);
    let reqwest_retry = reqwest_middleware::ClientBuilder::new(reqwest_client())
        .with(reqwest_retry::RetryTransientMiddleware::new_with_policy(
            retry_policy,
        ))
        .build();
    rows.push(run("reqwest + reqwest-retry 0.9", reqwest_sender(reqwest_retry)).await);

    // The crate's defaults but for the retry budget: 5 of 6 first attempts fail here, and
    // the default budget (a 10 retries/s floor plus 20 % of requests) would rightly throttle
    // such a burst. A 100/s floor lets every retry the table allows through.
    let policy = || RetryPolicy::builder().lock_free_budget(Duration::from_secs(10), 100, 0.2);
    let ours = ServiceBuilder::new()
        .layer(policy().build()?)
        .timeout(PER_ATTEMPT)
        .service(client());
    rows.push(run("tower-retry-safety (tower layer)", tower_sender(ours)).await);

    #[cfg(feature = "reqwest-middleware")]
    {
        // A policy of its own: clones share one retry budget, and this row should not start
        // with the budget the row above spent.
        let policy = policy().build()?;
        let ours = reqwest_middleware::ClientBuilder::new(reqwest_client())
            .with(tower_retry_safety::RetrySafetyMiddleware::new(policy))
            .build();
        rows.push(
            run(
                "tower-retry-safety (reqwest-middleware)",
                reqwest_sender(ours),
            )
            .await,
        );
    }

    // Hedging: tower's `hedge` at p90 of 20 ms (its histogram pre-filled, as after a
    // warm-up), and this crate's at a fixed 20 ms with up to 50 % extra load.
    let tower_hedge = tower::hedge::Hedge::new_with_mock_latencies(
        ServiceBuilder::new().timeout(PER_ATTEMPT).service(client()),
        HedgeAll,
        10,
        0.9,
        Duration::from_secs(60),
        &[20; 100],
    );
    // Not `Clone`: shared through a buffer.
    let tower_hedge = tower::buffer::Buffer::new(tower_hedge, 1024);
    rows.push(run("tower::hedge, typical policy", tower_sender(tower_hedge)).await);
    let hedged = ServiceBuilder::new()
        .layer(
            policy()
                .hedge(Hedge::fixed(Duration::from_millis(20)).max_extra_load(0.5))
                .build()?,
        )
        .timeout(PER_ATTEMPT)
        .service(client());
    rows.push(run("tower-retry-safety + hedging", tower_sender(hedged)).await);

    // Keys end to end: the client mints one per write and reuses it on every attempt; the
    // server's IdempotencyLayer replays the stored response of a write that already ran.
    let keyed = ServiceBuilder::new()
        .layer(policy().mint_idempotency_keys(true).build()?)
        .timeout(PER_ATTEMPT)
        .service(client());
    let keyed_server =
        FaultServer::start_with_keys(IdempotencyLayer::new(MemoryStore::new())).await;
    rows.push(
        run_against(
            "tower-retry-safety + idempotency keys",
            tower_sender(keyed),
            keyed_server,
        )
        .await,
    );

    println!(
        "{total} writes (POST) and {total} reads (GET); each op's first attempt gets one of: {}",
        Fault::ALL.map(Fault::name).join(", ")
    );
    println!(
        "\n{:<42} {:>20} {:>16} {:>17} {:>16}",
        "stack", "writes applied twice", "reads recovered", "writes answered", "server attempts"
    );
    for r in &rows {
        println!(
            "{:<42} {:>20} {:>16} {:>17} {:>16}",
            r.name,
            format!("{} / {total}", r.applied_twice),
            format!("{} / {total}", r.reads_recovered),
            format!("{} / {total}", r.writes_ok),
            r.attempts,
        );
    }
    #[cfg(not(feature = "reqwest-middleware"))]
    println!("(add --features reqwest-middleware for the RetrySafetyMiddleware row)");
    println!(
        "\nwrites applied twice  writes the server applied more than once (a repeated side effect)\n\
         reads recovered       reads that ended in a 200, after retries if any\n\
         writes answered       writes whose caller got a 200; the others got an error or the\n\
         {:22}failed response, each saying whether the write may have been applied\n\
         server attempts       requests that reached the server: {} operations, plus one per retry",
        "",
        2 * total
    );

    // Reads whose body is cut mid-way: the same stacks, and this crate with the body made
    // part of the attempt.
    let mut cut_rows: Vec<(&str, usize)> = Vec::new();
    let typical = ServiceBuilder::new()
        .retry(TypicalPolicy { left: 3 })
        .timeout(PER_ATTEMPT)
        .service(client());
    cut_rows.push((
        "tower::retry, typical policy",
        cut_reads(tower_get(typical)).await,
    ));
    let retry_policy =
        reqwest_retry::policies::ExponentialBackoff::builder().build_with_max_retries(3);
    let reqwest_retry = reqwest_middleware::ClientBuilder::new(reqwest_client())
        .with(reqwest_retry::RetryTransientMiddleware::new_with_policy(
            retry_policy,
        ))
        .build();
    cut_rows.push((
        "reqwest + reqwest-retry 0.9",
        cut_reads(reqwest_get(reqwest_retry)).await,
    ));
    let ours = ServiceBuilder::new()
        .layer(policy().build()?)
        .layer(tower_retry_safety::ReadWholeLayer::new())
        .service(client());
    cut_rows.push((
        "tower-retry-safety + ReadWholeLayer",
        cut_reads(tower_get(ours)).await,
    ));
    #[cfg(feature = "reqwest-middleware")]
    {
        let plain = reqwest::Client::new();
        let ours = reqwest_middleware::ClientBuilder::new(plain.clone())
            .with(tower_retry_safety::RetrySafetyMiddleware::new(
                policy().build()?,
            ))
            .with(tower_retry_safety::ReadWholeMiddleware::new().resume_with(plain))
            .build();
        cut_rows.push((
            "tower-retry-safety + ReadWholeMiddleware",
            cut_reads(reqwest_get(ours)).await,
        ));
    }
    let cut_total = CUT_OPS_PER_SIZE; // half of the 2 × CUT_OPS_PER_SIZE GETs are cut
    println!(
        "\nreads whose body is cut mid-way: {} GETs (16 KiB and 1 MiB), the first response of \
         {cut_total} cut right after the head or half-way",
        2 * CUT_OPS_PER_SIZE
    );
    println!("\n{:<42} {:>20}", "stack", "cut reads recovered");
    for (name, recovered) in &cut_rows {
        println!("{:<42} {:>20}", name, format!("{recovered} / {cut_total}"));
    }

    show_suppressed_error().await
}
