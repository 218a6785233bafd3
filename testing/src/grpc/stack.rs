//! The gRPC tests' stack: the client layer between a generated `LedgerClient` and a tonic
//! `Channel` to the lab service, its errors as `tonic::Status`, and the policy they share.

use std::net::SocketAddr;
use std::time::Duration;

use tower::ServiceBuilder;
use tower_retry_safety::{RetryPolicy, RetryPolicyBuilder};

use super::channel;
use super::lab::ledger_client::LedgerClient;

/// The gRPC tests' policy: the lab's proto, fast retries.
pub fn builder() -> RetryPolicyBuilder {
    RetryPolicy::builder()
        .jitter(false)
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .max_retries(2)
        .grpc_descriptors(&super::descriptor_set())
}

/// The layer on a `Channel`, its errors as `tonic::Status`.
pub type Layered = tower::util::MapErr<
    tower_retry_safety::RetrySafety<tonic::transport::Channel>,
    fn(tower_retry_safety::Error) -> tonic::Status,
>;

pub type Client = LedgerClient<Layered>;

/// The layer between a generated client and a `Channel` to `addr`.
pub async fn layered(addr: SocketAddr, policy: RetryPolicy) -> Layered {
    ServiceBuilder::new()
        .map_err(tonic::Status::from as fn(_) -> _)
        .layer(policy)
        .service(channel(addr).await)
}

/// The README's gRPC stack: the layer between the generated client and a `Channel`.
pub async fn client(addr: SocketAddr, policy: RetryPolicy) -> Client {
    LedgerClient::new(layered(addr, policy).await)
}
