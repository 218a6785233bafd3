//! `demo`: the upstream, the proxy and clients in one process on loopback — tower-retry-safety's
//! stacks and `tower::retry` with a typical policy, each run through
//! [`run_stack`](retry_safety_lab::run_stack) against a fresh proxy and upstream.

use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retry_safety_lab::{run_stack, Fault, LabError, ProxyReport};
use tower::retry::Policy;
use tower::ServiceBuilder;
use tower_retry_safety::{BoxError, RetryPolicy};

use super::error::CliError;

/// Operations per kind and stack: 20 per fault of the default mix.
pub(super) const OPS: usize = 120;
/// The clients' timeout per attempt, far below the proxy's slow hold (20 s in `run_stack`).
const PER_ATTEMPT: Duration = Duration::from_secs(1);

type Req = Request<Full<Bytes>>;

/// One stack's counts.
#[derive(Clone, Debug)]
pub(super) struct DemoRow {
    /// The stack.
    stack: &'static str,
    /// Whether the demo expects it never to apply a write twice.
    safe: bool,
    /// What the proxy counted.
    report: ProxyReport,
}

/// The retry policy people typically write for `tower::retry`: retry errors, 5xx and 429, up
/// to 3 times, after a short pause.
#[derive(Clone, Debug)]
struct TypicalPolicy {
    left: u32,
}

impl TypicalPolicy {
    /// Up to `retries` retries.
    fn new(retries: u32) -> Self {
        TypicalPolicy { left: retries }
    }
}

impl<B> Policy<Req, Response<B>, BoxError> for TypicalPolicy {
    /// The pause before a retry.
    type Future = Pin<Box<tokio::time::Sleep>>;

    /// Any error, 5xx or 429 is retried, whatever the request, while retries are left: the
    /// writes this applies twice are the lab's point.
    fn retry(
        &mut self,
        _req: &mut Req,
        result: &mut Result<Response<B>, BoxError>,
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

    /// A copy of the method, URI, headers and body.
    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        let mut copy = Request::new(req.body().clone());
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        *copy.headers_mut() = req.headers().clone();
        Some(copy)
    }
}

fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

fn boxed<F>(f: F) -> Pin<Box<dyn Future<Output = Result<ProxyReport, LabError>> + Send>>
where
    F: Future<Output = Result<ProxyReport, LabError>> + Send + 'static,
{
    Box::pin(f)
}

/// Every stack's row, `ops` writes and `ops` reads each.
pub(super) async fn run_demo(ops: usize) -> Result<Vec<DemoRow>, CliError> {
    let policy_error = |err: tower_retry_safety::BuildError| CliError::new("demo", err.to_string());
    // The crate's defaults but for the retry budget: 5 of 6 first attempts fail here, and
    // the default budget would rightly throttle such a burst (as in the tour).
    let policy = || {
        RetryPolicy::builder()
            .lock_free_budget(Duration::from_secs(10), 100, 0.2)
            .attempt_timeout(PER_ATTEMPT)
    };
    let ours = policy().build().map_err(policy_error)?;
    let keyed = policy()
        .mint_idempotency_keys(true)
        .build()
        .map_err(policy_error)?;
    let stacks: Vec<(&'static str, bool, _)> = vec![
        (
            "no retry",
            true,
            boxed(run_stack(
                ServiceBuilder::new().timeout(PER_ATTEMPT).service(client()),
                ops,
            )),
        ),
        (
            "tower::retry, typical policy",
            false,
            boxed(run_stack(
                ServiceBuilder::new()
                    .retry(TypicalPolicy::new(3))
                    .timeout(PER_ATTEMPT)
                    .service(client()),
                ops,
            )),
        ),
        (
            "tower-retry-safety (tower layer)",
            true,
            boxed(run_stack(
                ServiceBuilder::new().layer(ours).service(client()),
                ops,
            )),
        ),
        (
            "tower-retry-safety + idempotency keys",
            true,
            boxed(run_stack(
                ServiceBuilder::new().layer(keyed).service(client()),
                ops,
            )),
        ),
    ];
    let mut rows = Vec::new();
    // One stack at a time: each has the loopback to itself.
    for (stack, safe, run) in stacks {
        rows.push(DemoRow {
            stack,
            safe,
            report: run.await?,
        });
    }
    Ok(rows)
}

/// Whether the demo shows what it claims: the safe stacks applied no write twice, the
/// typical `tower::retry` some.
pub(super) fn demo_holds(rows: &[DemoRow]) -> bool {
    rows.iter().all(|r| {
        if r.safe {
            r.report.applied_twice() == 0
        } else {
            r.report.applied_twice() > 0
        }
    })
}

/// The demo's table, like the tour's.
pub(super) fn demo_table(rows: &[DemoRow]) -> String {
    let mut out = String::new();
    let ops = rows.first().map_or(0, |r| r.report.writes());
    let mix: Vec<&str> = Fault::DEFAULT_MIX.iter().map(|f| f.name()).collect();
    let _ = writeln!(
        out,
        "{ops} writes (POST /v1/payments) and {ops} reads (GET /v1/payments/{{id}}) per stack, through \
         the lab's proxy to its upstream;\neach op's first attempt gets one of: {}",
        mix.join(", ")
    );
    let _ = writeln!(
        out,
        "\n{:<40} {:>20} {:>16} {:>17} {:>9} {:>18}",
        "stack",
        "writes applied twice",
        "reads recovered",
        "writes answered",
        "attempts",
        "upstream requests"
    );
    for r in rows {
        let report = &r.report;
        let _ = writeln!(
            out,
            "{:<40} {:>20} {:>16} {:>17} {:>9} {:>18}",
            r.stack,
            format!("{} / {}", report.applied_twice(), report.writes()),
            format!("{} / {}", report.reads_recovered(), report.reads()),
            format!("{} / {}", report.writes_answered(), report.writes()),
            report.attempts(),
            report.upstream_requests(),
        );
    }
    let _ = write!(
        out,
        "\nwrites applied twice  writes the upstream applied more than once (a stored response applies nothing)\n\
         reads recovered       reads whose client got a 2xx, after retries if any\n\
         writes answered       writes whose client got a 2xx; the others got an error or the failed response\n\
         attempts              attempts the proxy saw: the operations, plus one per resend\n\
         upstream requests     attempts the proxy forwarded and the upstream answered (not the 429s and 500s\n\
         {:22}it gave itself before apply)\n",
        ""
    );
    out
}
