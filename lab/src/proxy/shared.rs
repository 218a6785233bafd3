//! What every request's handling shares: the settings, the ledger, the upstream's client.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;

use super::config::ProxyConfig;
use crate::ledger::Ledger;

/// One per proxy, behind an `Arc` that each connection's handler holds.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) config: ProxyConfig,
    pub(super) ledger: Arc<Ledger>,
    pub(super) client: Client<HttpConnector, Full<Bytes>>,
    /// Whether an upstream failure was reported on stderr (once is enough).
    pub(super) reported: AtomicBool,
}
