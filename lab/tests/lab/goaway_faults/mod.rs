//! The HTTP/2 GOAWAY faults, seen on the wire and through clients: `goaway-before-forwarding`
//! sends a last-stream-id below the faulted stream (not processed: the upstream never sees
//! it), `goaway-after-apply` one that covers it and closes without its answer. Streams
//! already forwarded are answered before the connection closes; the ledger's counts equal
//! the upstream's; HTTP/1.1 clients get the connection-close faults.
//!
//! This module holds what its children share: the faulted proxy, the clients and the GOAWAYs
//! a raw client received.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retry_safety_lab::{Fault, Proxy, ProxyConfig};

use crate::raw_h2_client::{RawH2, GOAWAY};
use crate::stacks::payment_routes;

mod client_retries;
mod counts_under_interleavings;
mod streams_on_the_wire;

pub(crate) type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Far below the proxy's slow hold, far above a loopback round trip.
pub(crate) const PER_ATTEMPT: Duration = Duration::from_secs(2);

/// A proxy giving `faults` in turn, with the demo's routes and a 20 s slow hold.
pub(crate) async fn proxy(upstream: &str, faults: Vec<Fault>) -> Proxy {
    let config = ProxyConfig::new(upstream)
        .expect("valid upstream")
        .faults(faults)
        .routes(payment_routes())
        .slow(Duration::from_secs(20));
    Proxy::start(config, loopback()).await.expect("proxy")
}

pub(crate) fn loopback() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, 0))
}

pub(crate) fn h2_client() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

/// The GOAWAYs received: (last-stream-id, error code).
pub(crate) fn goaways(client: &RawH2) -> Vec<(u32, u32)> {
    client
        .of_kind(GOAWAY)
        .iter()
        .filter_map(|f| f.goaway())
        .collect()
}
