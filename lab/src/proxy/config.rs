//! What the proxy does and where it forwards: its settings, each with its default.

use std::time::Duration;

use http::header::HeaderName;
use http::Uri;

use crate::error::LabError;
use crate::fault::Fault;
use crate::op_id::OpIdentity;
use crate::routes::RouteKinds;

/// What the proxy does and where it forwards.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    pub(super) upstream: Uri,
    pub(super) upstream_display: String,
    pub(super) faults: Vec<Fault>,
    pub(super) identity: OpIdentity,
    pub(super) routes: RouteKinds,
    pub(super) slow: Duration,
    pub(super) max_body: usize,
    pub(super) stored_response_header: HeaderName,
}

impl ProxyConfig {
    /// Forwards to `upstream`, an `http://` URL (a path, if any, is put before every
    /// request's). Refuses another scheme and user information (never echoed: it may hold a
    /// password).
    pub fn new(upstream: &str) -> Result<Self, LabError> {
        let bad = |reason: &str| LabError::new("--upstream", reason.to_owned());
        let uri: Uri = upstream
            .parse()
            .map_err(|_| bad("not a URL: expected http://HOST:PORT"))?;
        let authority = uri
            .authority()
            .ok_or_else(|| bad("not a URL: expected http://HOST:PORT"))?;
        if authority.as_str().contains('@') {
            return Err(bad("user information is not supported in the upstream URL"));
        }
        if uri.scheme_str() != Some("http") {
            return Err(bad("only http:// upstreams are supported"));
        }
        Ok(ProxyConfig {
            upstream_display: format!("http://{authority}"),
            upstream: uri,
            faults: Fault::DEFAULT_MIX.to_vec(),
            identity: OpIdentity::new(),
            routes: RouteKinds::new(),
            slow: Duration::from_secs(30),
            max_body: 1024 * 1024,
            stored_response_header: HeaderName::from_static("idempotent-replayed"),
        })
    }

    /// The faults given in turn to each route's operations' first attempts. An empty list
    /// means none.
    ///
    /// Defaults to [`Fault::DEFAULT_MIX`].
    pub fn faults(mut self, faults: Vec<Fault>) -> Self {
        self.faults = faults;
        self
    }

    /// How attempts are told to be one operation.
    ///
    /// Defaults to [`OpIdentity::new`].
    pub fn identity(mut self, identity: OpIdentity) -> Self {
        self.identity = identity;
        self
    }

    /// Which routes are writes and which reads, and the rows they are counted in.
    ///
    /// Defaults to the method's kind, one row per method.
    pub fn routes(mut self, routes: RouteKinds) -> Self {
        self.routes = routes;
        self
    }

    /// How long a slow answer is held (unless the client gives up first, which ends it):
    /// set the client's timeout well below it.
    ///
    /// Defaults to 30 s.
    pub fn slow(mut self, slow: Duration) -> Self {
        self.slow = slow;
        self
    }

    /// The longest request or upstream response body read; a longer request is refused with
    /// a 413 and not counted, a longer response answered 502 (the attempt counted as sent,
    /// with no answer: it may have applied).
    ///
    /// Defaults to 1 MiB.
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// The response header with which the upstream marks a stored response (an answer to a
    /// repeat, which ran nothing), for a server that does not use `idempotent-replayed: true`. Its value
    /// must be `true` (any case). Refuses an invalid header name.
    ///
    /// Defaults to `idempotent-replayed`.
    pub fn replayed_header(mut self, name: &str) -> Result<Self, LabError> {
        self.stored_response_header =
            HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| {
                LabError::new(
                    "--replayed-header",
                    format!("{name:?} is not a header name"),
                )
            })?;
        Ok(self)
    }

    pub(super) fn target(&self, path_and_query: &str) -> Option<Uri> {
        let base = self.upstream.path().trim_end_matches('/');
        let authority = self.upstream.authority()?;
        Uri::builder()
            .scheme("http")
            .authority(authority.clone())
            .path_and_query(format!("{base}{path_and_query}"))
            .build()
            .ok()
    }
}
