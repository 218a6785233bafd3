//! A nested call made while hyper polls a streamed response body, after the handler's
//! future has ended, inherits the caller's deadline (issue 48, item 5b).

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
use tower_idempotency_keys::deadline::DeadlineLayer;
use tower_retry_safety::RetryPolicy;

use super::loopback::{next_hop, one_call_within, send, serve};

const MAX: Duration = Duration::from_secs(30);

/// issue 48, item 5b: the handler answers at once with a streamed body whose only frame
/// comes from a nested call through a retry layer that sends deadlines to the next hop; the
/// next hop receives `request-timeout-ms`, within the caller's 5 s. Before: the body was
/// polled outside the deadline's scope, and the nested call went out with no deadline
/// header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_call_made_while_a_streamed_body_is_sent_carries_the_deadline() {
    let (next, seen) = next_hop();

    let policy = RetryPolicy::builder()
        .send_deadline_to("127.0.0.1")
        .build()
        .expect("policy");
    let outbound = ServiceBuilder::new()
        .layer(policy)
        .service(Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>());
    let handler = service_fn(move |_req: Request<Incoming>| {
        let outbound = outbound.clone();
        // The nested call runs when hyper first polls the body, after this future ended.
        let frame = async move {
            let req = Request::get(format!("http://{next}/nested"))
                .body(Full::new(Bytes::new()))
                .expect("request");
            let res = outbound.oneshot(req).await.map_err(BoxError::from)?;
            Ok::<_, BoxError>(Frame::data(Bytes::from(res.status().as_u16().to_string())))
        };
        let body = StreamBody::new(futures_util::stream::once(frame));
        async move { Ok::<_, Infallible>(Response::new(body)) }
    });
    let addr = serve(
        ServiceBuilder::new()
            .layer(DeadlineLayer::new(MAX))
            .service(handler),
    );
    let req = Request::get(format!("http://{addr}/stream"))
        .header("request-timeout-ms", "5000")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let (res, body) = send(req).await;
    assert_eq!((res.status(), body.as_str()), (StatusCode::OK, "200"));
    one_call_within(&seen, 5_000);
}
