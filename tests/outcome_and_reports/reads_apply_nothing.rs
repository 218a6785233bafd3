//! "May have been applied" is true only of what can be applied, through both front ends and
//! real sockets: a GET that timed out after the server ran it is ambiguous (its outcome is
//! unknown) but applied nothing; a DELETE or a POST in the same cell may have been applied.
//! From a new user's report: an SDK that passed the answer on told its users a read "may
//! have been applied".

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retry_safety_testing::fault_server::{refused_addr, Fault, FaultServer};
use tower::{Layer, ServiceExt};
use tower_retry_safety::{MayHaveBeenApplied, RetryPolicy};

// Well under the fault server's 800 ms slow response.
const PER_ATTEMPT: Duration = Duration::from_millis(200);

fn policy() -> RetryPolicy {
    RetryPolicy::builder()
        .no_budget()
        .max_retries(0)
        .attempt_timeout(PER_ATTEMPT)
        .build()
        .unwrap()
}

/// (method, the error's `is_ambiguous`, its `may_have_been_applied`) for a slow answer after
/// apply (a timeout), then for a connection refused (never sent).
const CELLS: [(Method, bool, bool); 4] = [
    (Method::GET, true, false),
    (Method::HEAD, true, false),
    (Method::DELETE, true, true),
    (Method::POST, true, true),
];

#[tokio::test]
async fn through_the_tower_layer_a_timed_out_read_applied_nothing() {
    let server = FaultServer::start().await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let svc = policy().layer(client);
    for (method, ambiguous, applied) in CELLS {
        let op = format!("tower-{method}");
        let req = Request::builder()
            .method(method.clone())
            .uri(server.url(&op))
            .header("x-fault", Fault::SlowAfterApply.name())
            .body(Full::default())
            .unwrap();
        let err = svc.clone().oneshot(req).await.unwrap_err();
        assert!(err.is_timeout(), "{method}: {err}");
        assert_eq!(err.is_ambiguous(), ambiguous, "{method}: {err}");
        assert_eq!(err.may_have_been_applied(), applied, "{method}: {err}");
        assert_eq!(MayHaveBeenApplied::may_have_been_applied(&err), applied);
        let report = err.report().unwrap();
        assert_eq!(report.may_have_been_applied(), applied, "{method}");
    }
    let refused = refused_addr().await;
    for (method, _, _) in CELLS {
        let req = Request::builder()
            .method(method.clone())
            .uri(format!("http://{refused}/refused"))
            .body(Full::default())
            .unwrap();
        let err = svc.clone().oneshot(req).await.unwrap_err();
        assert!(
            !err.is_ambiguous() && !err.may_have_been_applied(),
            "{method}"
        );
    }
}

#[cfg(feature = "reqwest-middleware")]
#[tokio::test]
async fn through_the_reqwest_middleware_a_timed_out_read_applied_nothing() {
    use reqwest_middleware::ClientBuilder;
    use tower_retry_safety::{Error, RetrySafetyMiddleware};

    let server = FaultServer::start().await;
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetrySafetyMiddleware::new(policy()))
        .build();
    for (method, ambiguous, applied) in CELLS {
        let op = format!("reqwest-{method}");
        let err = client
            .request(method.clone(), server.url(&op))
            .header("x-fault", Fault::SlowAfterApply.name())
            .send()
            .await
            .unwrap_err();
        assert_eq!(err.may_have_been_applied(), applied, "{method}: {err}");
        let ours = Error::from_reqwest_middleware(&err).unwrap();
        assert_eq!(ours.is_ambiguous(), ambiguous, "{method}: {ours}");
        assert_eq!(ours.may_have_been_applied(), applied, "{method}: {ours}");
    }
}
