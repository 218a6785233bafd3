//! Cost per call over a real connection: a tonic server on 127.0.0.1 (the lab's `Ledger`),
//! a unary read (`Count`) through one tonic `Channel` bare and through this layer, each on a
//! `Channel` (an HTTP/2 connection) of its own. Interleaved batches, medians, a ratio.
//!
//! Run: `cargo bench --bench grpc --features tonic`

use std::hint::black_box;
use std::time::{Duration, Instant};

use tower::ServiceBuilder;
use tower_retry_safety::RetryPolicy;

use retry_safety_testing::batch;
use retry_safety_testing::bench::median;

use retry_safety_testing::grpc as grpc_lab;

use grpc_lab::lab::ledger_client::LedgerClient;
use grpc_lab::lab::CountRequest;

async fn call<T>(client: &mut LedgerClient<T>)
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    T::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error:
        Into<Box<dyn std::error::Error + Send + Sync>> + Send,
{
    let req = CountRequest { id: "bench".into() };
    black_box(client.count(req).await.expect("the call succeeds"));
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let (addr, _lab) = grpc_lab::serve().await;
    let mut bare = LedgerClient::new(grpc_lab::channel(addr).await);
    let policy = RetryPolicy::builder()
        .grpc_descriptors(&grpc_lab::descriptor_set())
        .build()
        .expect("the bench's policy is valid");
    let mut layered = LedgerClient::new(
        ServiceBuilder::new()
            .map_err(tower_retry_safety::grpc::into_status)
            .layer(policy)
            .service(grpc_lab::channel(addr).await),
    );
    for _ in 0..2_000 {
        call(&mut bare).await;
        call(&mut layered).await;
    }
    let (mut a, mut b) = (vec![], vec![]);
    let deadline = Instant::now() + Duration::from_secs(60);
    for round in 0..101 {
        // Whichever runs second in a round may gain from a warm cache: the order alternates.
        if round % 2 == 0 {
            batch!(a, 200, call(&mut bare).await);
            batch!(b, 200, call(&mut layered).await);
        } else {
            batch!(b, 200, call(&mut layered).await);
            batch!(a, 200, call(&mut bare).await);
        }
        if Instant::now() > deadline {
            break;
        }
    }
    let (bare_ns, layer_ns) = (median(&mut a), median(&mut b));
    println!("grpc_bare  median {bare_ns:>9.0} ns/call");
    println!("grpc_layer median {layer_ns:>9.0} ns/call");
    println!("ratio grpc_layer/grpc_bare {:.3}", layer_ns / bare_ns);
}
