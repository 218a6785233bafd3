//! The stack the read-whole tests drive: the retry layer with `ReadWholeLayer` inside it over
//! hyper-util's client, and the bodies they send.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tower::{Service, ServiceBuilder};
use tower_retry_safety::{ReadWholeLayer, RetryPolicy, WholeBody};

/// A body of `len` bytes whose every position can be told from its neighbours'.
pub fn representation(len: usize) -> Bytes {
    (0..len)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// Three retries, short waits, no budget.
pub fn policy() -> tower_retry_safety::RetryPolicyBuilder {
    RetryPolicy::builder()
        .max_retries(3)
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .no_budget()
}

pub fn stack(
    policy: RetryPolicy,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<WholeBody<hyper::body::Incoming>>,
    Error = tower_retry_safety::Error,
> + Clone {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    ServiceBuilder::new()
        .layer(policy)
        .layer(ReadWholeLayer::new())
        .service(client)
}
