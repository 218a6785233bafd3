//! The layer over a scripted inner service, shared by the decision table's tests: a policy
//! without jitter or budget, a read and a write, one run of a request, and its report.

use std::time::Duration;

use http::{Request, Response};
use retry_safety_testing::script::Script;
use tower::{Layer, ServiceExt};
use tower_retry_safety::{RetryPolicy, RetryPolicyBuilder, RetryReport};

pub(crate) fn builder() -> RetryPolicyBuilder {
    RetryPolicy::builder()
        .jitter(false)
        .backoff(Duration::from_millis(500), Duration::from_secs(8))
        .no_budget()
}

pub(crate) fn get() -> Request<String> {
    Request::get("http://api.test/v1/things/1")
        .body(String::new())
        .unwrap()
}

pub(crate) fn post() -> Request<String> {
    Request::post("http://api.test/v1/tools/execute/GMAIL_SEND_EMAIL")
        .body("{\"to\":\"a@example.com\"}".to_owned())
        .unwrap()
}

pub(crate) type Out = Result<Response<String>, tower_retry_safety::Error>;

pub(crate) async fn run(policy: RetryPolicyBuilder, script: &Script, req: Request<String>) -> Out {
    policy
        .build()
        .unwrap()
        .layer(script.clone())
        .oneshot(req)
        .await
}

pub(crate) fn report(out: &Out) -> RetryReport {
    match out {
        Ok(res) => res.extensions().get::<RetryReport>().unwrap().clone(),
        Err(e) => e.report().unwrap().clone(),
    }
}
