//! An SDK-style client: reads are left to the policy, `execute_tool` is marked as a
//! non-idempotent write, `search` is a POST routed as a read. The API's rate limiter answers
//! 429 before running anything, so a 429 proves nothing was applied and a write is retried on
//! it. The policy owns the time (per-attempt timeout and total deadline, ending in its typed
//! error); one call narrows them with `RequestOptions`. tower-http sets a request id (the same
//! on every attempt, so support can follow one logical call) and traces each call.
//!
//! Run: `cargo run --example sdk_client`. It talks to the fault server on loopback.

use retry_safety_testing::fault_server;

use std::time::Duration;

use bytes::Bytes;
use fault_server::{Fault, FaultServer};
use http::{HeaderName, Method, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::sync::atomic::{AtomicU64, Ordering};
use tower::util::BoxCloneSyncService;
use tower::{ServiceBuilder, ServiceExt};
use tower_http::request_id::{MakeRequestUuid, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

use tower_retry_safety::peek::PeekBodyLayer;
use tower_retry_safety::policy::Decision;
use tower_retry_safety::{
    FailureClass, Idempotency, RequestOptions, RetryPolicy, RetryReport, StopReason,
};

static RETRIES: AtomicU64 = AtomicU64::new(0);
static SUPPRESSED: AtomicU64 = AtomicU64::new(0);

type Body = BoxBody<Bytes, hyper::Error>;
type Svc = BoxCloneSyncService<Request<Full<Bytes>>, Response<Body>, tower_retry_safety::Error>;
/// Uploads go out as `reqwest::Body` (what the SDK's users hand it), behind the same policy.
type UploadSvc =
    BoxCloneSyncService<Request<reqwest::Body>, Response<Body>, tower_retry_safety::Error>;

/// The SDK's client. Cheap to clone; one retry budget for all its clones.
#[derive(Clone)]
struct ToolsClient {
    base: String,
    svc: Svc,
    uploads: UploadSvc,
}

/// What the SDK hands its users: the body, or an error that says whether the call may have
/// been applied.
#[derive(Debug)]
struct CallError(tower_retry_safety::Error);

impl ToolsClient {
    fn new(base: String) -> Result<Self, tower_retry_safety::BuildError> {
        let policy = RetryPolicy::builder()
            .max_retries(3)
            .backoff(Duration::from_millis(50), Duration::from_secs(2))
            .route(Method::POST, "/v1/search", Idempotency::Idempotent)
            // The same client also calls a partner API whose /v1/search starts a job: a rule
            // scoped to its host never applies to ours.
            .route_for_host(
                "partner.example.com",
                Method::POST,
                "/v1/search",
                Idempotency::NonIdempotent,
            )
            // This API's 429 comes from a rate limiter in front of the handlers.
            .not_applied_statuses([StatusCode::TOO_MANY_REQUESTS])
            .attempt_timeout(Duration::from_millis(300))
            .deadline(Duration::from_secs(5))
            // Metrics: count retries and suppressed writes (export them as you like).
            .on_attempt(|event| {
                let counter = match event.decision {
                    Decision::Retry { .. } => &RETRIES,
                    Decision::Stop(StopReason::SuppressedNotIdempotent) => &SUPPRESSED,
                    _ => return,
                };
                counter.fetch_add(1, Ordering::Relaxed);
            })
            .build()?;
        let request_id = HeaderName::from_static("x-request-id");
        let svc = ServiceBuilder::new()
            .map_response(|res: Response<_>| res.map(BodyExt::boxed))
            // One trace span and one request id per logical call, outside the retries.
            .layer(TraceLayer::new_for_http())
            .layer(SetRequestIdLayer::new(request_id.clone(), MakeRequestUuid))
            .layer(policy.clone())
            // Some of this API's errors are a 200 whose JSON names them: a rate limit that
            // refused the call before anything ran is proof that nothing was applied.
            .layer(PeekBodyLayer::new(
                4096,
                |_status, _headers, body: &[u8]| {
                    let limited = body.windows(14).any(|w| w == b"\"rate_limited\"");
                    limited.then_some(FailureClass::NotSent)
                },
            ))
            .service(Client::builder(TokioExecutor::new()).build_http());
        // The same policy (and so the same budget and metrics) over a client for
        // `reqwest::Body`: a streamed upload is recorded as it is sent (up to the policy's
        // replay buffer, 64 KiB by default), so a failed attempt can be replayed.
        let uploads = ServiceBuilder::new()
            .map_response(|res: Response<_>| res.map(BodyExt::boxed))
            .layer(SetRequestIdLayer::new(request_id, MakeRequestUuid))
            .layer(policy)
            .service(Client::builder(TokioExecutor::new()).build_http::<reqwest::Body>());
        Ok(ToolsClient {
            base,
            svc: BoxCloneSyncService::new(svc),
            uploads: BoxCloneSyncService::new(uploads),
        })
    }

    async fn send(&self, req: Request<Full<Bytes>>) -> Result<(Bytes, RetryReport), CallError> {
        let res = self.svc.clone().oneshot(req).await.map_err(CallError)?;
        Self::read(res).await
    }

    async fn read(res: Response<Body>) -> Result<(Bytes, RetryReport), CallError> {
        let report = RetryReport::of(&res).cloned();
        let body = res
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        Ok((body, report.expect("the layer reports on every response")))
    }

    fn request(
        &self,
        method: Method,
        path: &str,
        fault: Fault,
        body: &'static str,
    ) -> Request<Full<Bytes>> {
        Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("x-fault", fault.name())
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .expect("valid request")
    }

    /// A read: the policy retries it after any transient failure.
    async fn get_tool(&self, slug: &str, fault: Fault) -> Result<(Bytes, RetryReport), CallError> {
        self.send(self.request(Method::GET, &format!("/v1/tools/{slug}"), fault, ""))
            .await
    }

    /// A read the caller wants fast or not at all: this call's own options.
    async fn list_tools_quickly(&self, fault: Fault) -> Result<(Bytes, RetryReport), CallError> {
        let mut req = self.request(Method::GET, "/v1/tools", fault, "");
        req.extensions_mut().insert(
            RequestOptions::new()
                .max_retries(1)
                .deadline(Duration::from_millis(600)),
        );
        self.send(req).await
    }

    /// A POST that only reads: routed as idempotent in the policy.
    async fn search(&self, fault: Fault) -> Result<(Bytes, RetryReport), CallError> {
        self.send(self.request(Method::POST, "/v1/search", fault, "{\"q\":\"mail\"}"))
            .await
    }

    /// Uploads a file, streamed in chunks as `reqwest::Body` (a PUT: repeating it is harmless).
    async fn upload_file(
        &self,
        name: &str,
        chunks: Vec<&'static [u8]>,
        fault: Fault,
    ) -> Result<(Bytes, RetryReport), CallError> {
        let stream = chunks
            .into_iter()
            .map(|c| Ok::<_, std::io::Error>(Bytes::from_static(c)));
        let req = Request::put(format!("{}/v1/files/{name}", self.base))
            .header("x-fault", fault.name())
            .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
                stream,
            )))
            .expect("valid request");
        let res = self.uploads.clone().oneshot(req).await.map_err(CallError)?;
        Self::read(res).await
    }

    /// Runs a tool: a write with side effects. Marked so that nothing can retry it after it
    /// may have reached the server.
    async fn execute_tool(
        &self,
        slug: &str,
        fault: Fault,
    ) -> Result<(Bytes, RetryReport), CallError> {
        let mut req = self.request(
            Method::POST,
            &format!("/v1/tools/{slug}/execute"),
            fault,
            "{\"to\":\"a@example.com\"}",
        );
        req.extensions_mut().insert(Idempotency::NonIdempotent);
        self.send(req).await
    }
}

fn show(what: &str, out: &Result<(Bytes, RetryReport), CallError>) {
    match out {
        Ok((body, report)) => println!(
            "{what:<44} ok: {:?} after {} attempt(s), verdict from {}",
            String::from_utf8_lossy(body),
            report.attempts(),
            report.verdict().source().as_str()
        ),
        Err(CallError(e)) => println!(
            "{what:<44} error (ambiguous: {}, request id {:?}):\n    {e}",
            e.is_ambiguous(),
            e.request_id()
        ),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_target(false)
        .init();
    let server = FaultServer::start().await;
    let sdk = ToolsClient::new(format!("http://{}", server.addr()))?;

    show(
        "get_tool, 503 on the first attempt",
        &sdk.get_tool("GMAIL_SEND_EMAIL", Fault::UnavailableAfterApply)
            .await,
    );
    show(
        "search, response lost on the first attempt",
        &sdk.search(Fault::DropAfterApply).await,
    );
    show(
        "execute_tool, no fault",
        &sdk.execute_tool("SLACK_POST", Fault::None).await,
    );
    show(
        "execute_tool, rate-limited (429) before it ran",
        &sdk.execute_tool("NOTION_CREATE_PAGE", Fault::TooManyRequestsBeforeApply)
            .await,
    );
    show(
        "list_tools, slow: its own deadline",
        &sdk.list_tools_quickly(Fault::SlowAfterApply).await,
    );
    show(
        "upload_file (streamed reqwest::Body), response lost on the first attempt",
        &sdk.upload_file(
            "report.csv",
            vec![b"id,total\n", b"1,42\n"],
            Fault::DropAfterApply,
        )
        .await,
    );
    show(
        "execute_tool, response lost after it ran",
        &sdk.execute_tool("GMAIL_SEND_EMAIL", Fault::DropAfterApply)
            .await,
    );

    println!(
        "\nside effects on the server: GMAIL_SEND_EMAIL executed {} time(s), SLACK_POST {} time(s), NOTION_CREATE_PAGE {} time(s)",
        server.applied("/v1/tools/GMAIL_SEND_EMAIL/execute"),
        server.applied("/v1/tools/SLACK_POST/execute"),
        server.applied("/v1/tools/NOTION_CREATE_PAGE/execute"),
    );
    println!(
        "metrics from on_attempt: {} retries, {} suppressed write(s)",
        RETRIES.load(Ordering::Relaxed),
        SUPPRESSED.load(Ordering::Relaxed)
    );
    Ok(())
}
