//! One call to reach the outcome: `RetryReport::of` on a response from the tower layer, and
//! (feature `reqwest-middleware`) `Error::from_reqwest_middleware` and
//! `RetryReport::of_reqwest` through the adapter, against the fault server.

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retry_safety_testing::fault_server::{Fault, FaultServer};
use tower::{Layer, ServiceExt};
use tower_retry_safety::{RetryPolicy, RetryReport, StopReason};

fn get(url: String, fault: Fault) -> Request<Full<Bytes>> {
    Request::get(url)
        .header("x-fault", fault.name())
        .body(Full::default())
        .unwrap()
}

#[tokio::test]
async fn the_report_of_a_response_through_the_layer_and_none_without_it() {
    let server = FaultServer::start().await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let policy = RetryPolicy::builder().no_budget().build().unwrap();

    let fault = Fault::TooManyRequestsBeforeApply;
    let res = policy
        .layer(client.clone())
        .oneshot(get(server.url("read"), fault))
        .await
        .unwrap();
    let report = RetryReport::of(&res).unwrap();
    assert_eq!(report.attempts(), 2);
    assert_eq!(report.stop_reason(), StopReason::Final);

    let bare = client
        .oneshot(get(server.url("bare"), fault))
        .await
        .unwrap();
    assert!(RetryReport::of(&bare).is_none());
}

#[cfg(feature = "reqwest-middleware")]
mod reqwest_side {
    use std::time::Duration;

    use http::Extensions;
    use reqwest::{Request, Response};
    use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
    use tower_retry_safety::{Error, Idempotency, RetryPolicy, RetryReport, RetrySafetyMiddleware};

    use retry_safety_testing::fault_server::{refused_addr, Fault, FaultServer};

    // Well under the fault server's 800 ms slow response.
    const PER_ATTEMPT: Duration = Duration::from_millis(400);

    fn reqwest_client() -> reqwest::Client {
        reqwest::Client::builder()
            .timeout(PER_ATTEMPT)
            .build()
            .unwrap()
    }

    fn policy() -> RetryPolicy {
        RetryPolicy::builder().no_budget().build().unwrap()
    }

    /// What an SDK's own middleware does outside ours: adds context to every error.
    struct WithContext;

    #[async_trait::async_trait]
    impl Middleware for WithContext {
        async fn handle(
            &self,
            req: Request,
            ext: &mut Extensions,
            next: Next<'_>,
        ) -> reqwest_middleware::Result<Response> {
            match next.run(req, ext).await {
                Err(reqwest_middleware::Error::Middleware(e)) => Err(
                    reqwest_middleware::Error::Middleware(e.context("the SDK's call failed")),
                ),
                other => other,
            }
        }
    }

    /// A middleware that fails with an error of its own, never calling the next one.
    struct Refuses;

    #[async_trait::async_trait]
    impl Middleware for Refuses {
        async fn handle(
            &self,
            _req: Request,
            _ext: &mut Extensions,
            _next: Next<'_>,
        ) -> reqwest_middleware::Result<Response> {
            Err(reqwest_middleware::Error::middleware(
                std::io::Error::other("refused by policy"),
            ))
        }
    }

    async fn send_email(
        client: &ClientWithMiddleware,
        server: &FaultServer,
    ) -> reqwest_middleware::Error {
        client
            .post(server.url("send-email"))
            .header("x-fault", Fault::SlowAfterApply.name())
            .with_extension(Idempotency::NonIdempotent)
            .body("{\"to\":\"a@example.com\"}")
            .send()
            .await
            .unwrap_err()
    }

    #[tokio::test]
    async fn our_error_is_found_in_a_reqwest_middleware_error() {
        let server = FaultServer::start().await;
        let client = ClientBuilder::new(reqwest_client())
            .with(RetrySafetyMiddleware::new(policy()))
            .build();
        let err = send_email(&client, &server).await;
        let ours = Error::from_reqwest_middleware(&err).unwrap();
        assert!(ours.is_ambiguous());
        assert!(ours.retry_suppressed());
        assert_eq!(ours.attempts(), 1);
        assert_eq!(server.applied("send-email"), 1);
    }

    #[tokio::test]
    async fn our_error_is_found_behind_context_an_outer_middleware_added() {
        let server = FaultServer::start().await;
        let client = ClientBuilder::new(reqwest_client())
            .with(WithContext)
            .with(RetrySafetyMiddleware::new(policy()))
            .build();
        let err = send_email(&client, &server).await;
        assert!(err.to_string().contains("the SDK's call failed"), "{err}");
        let ours = Error::from_reqwest_middleware(&err).unwrap();
        assert!(ours.retry_suppressed());
    }

    #[tokio::test]
    async fn errors_our_middleware_did_not_make_are_not_ours() {
        let addr = refused_addr().await;
        let url = format!("http://{addr}/ops/x");
        let plain = ClientBuilder::new(reqwest_client()).build();
        let err = plain.get(&url).send().await.unwrap_err();
        assert!(matches!(err, reqwest_middleware::Error::Reqwest(_)));
        assert!(Error::from_reqwest_middleware(&err).is_none());

        let other = ClientBuilder::new(reqwest_client()).with(Refuses).build();
        let err = other.get(&url).send().await.unwrap_err();
        assert!(matches!(err, reqwest_middleware::Error::Middleware(_)));
        assert!(Error::from_reqwest_middleware(&err).is_none());
    }

    /// `MayHaveBeenApplied` always answers for a `reqwest_middleware::Error`: ours inside
    /// answers for itself (also behind context), a bare reqwest error is classified, any other
    /// middleware's error is ambiguous.
    #[tokio::test]
    async fn may_have_been_applied_always_answers() {
        use tower_retry_safety::MayHaveBeenApplied;

        let server = FaultServer::start().await;
        let ours = ClientBuilder::new(reqwest_client())
            .with(WithContext)
            .with(RetrySafetyMiddleware::new(policy()))
            .build();
        // Ours, suppressed after a slow response: may have been applied (it was).
        let err = send_email(&ours, &server).await;
        assert!(err.may_have_been_applied());
        assert_eq!(server.applied("send-email"), 1);

        let addr = refused_addr().await;
        let url = format!("http://{addr}/ops/x");
        // Ours, every attempt refused: not applied.
        let err = ours.post(&url).send().await.unwrap_err();
        assert!(Error::from_reqwest_middleware(&err).is_some());
        assert!(!err.may_have_been_applied(), "{err}");
        // A client without our middleware, refused: classified as not sent.
        let plain = ClientBuilder::new(reqwest_client()).build();
        let err = plain.post(&url).send().await.unwrap_err();
        assert!(matches!(err, reqwest_middleware::Error::Reqwest(_)));
        assert!(!err.may_have_been_applied(), "{err}");
        // A client without it, timed out after the write: may have been applied.
        let err = plain
            .post(server.url("plain-slow"))
            .header("x-fault", Fault::SlowAfterApply.name())
            .send()
            .await
            .unwrap_err();
        assert!(err.may_have_been_applied(), "{err}");
        // Another middleware's own error, not ours: ambiguous, whatever it says.
        let other = ClientBuilder::new(reqwest_client()).with(Refuses).build();
        let err = other.post(&url).send().await.unwrap_err();
        assert!(err.may_have_been_applied());
    }

    #[tokio::test]
    async fn the_report_of_a_reqwest_response_and_none_without_our_middleware() {
        let server = FaultServer::start().await;
        let ours = ClientBuilder::new(reqwest_client())
            .with(RetrySafetyMiddleware::new(policy()))
            .build();
        let res = ours
            .get(server.url("read"))
            .header("x-fault", Fault::UnavailableAfterApply.name())
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        let report = RetryReport::of_reqwest(&res).unwrap();
        assert_eq!(report.attempts(), 2);
        assert_eq!(server.stats("read").attempts, 2);

        let plain = ClientBuilder::new(reqwest_client()).build();
        let res = plain.get(server.url("plain")).send().await.unwrap();
        assert!(RetryReport::of_reqwest(&res).is_none());
    }
}
