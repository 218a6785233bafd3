//! `proxy`: the fault-injecting reverse proxy. Each operation's first attempt gets the next
//! fault of its route's turn in the mix; later attempts pass through; the ledger counts
//! what was handed to the upstream (and may have applied) from the moment it is handed.
//! HTTP/1.1 clients are served by hyper, HTTP/2 ones by [`h2_serve`](super::h2_serve) (for
//! its GOAWAY faults); both hand requests to the same handler ([`handle`]), which forwards
//! ([`forward`]); both give the proxy's own answers from [`answers`]; [`config`] holds the
//! settings, [`shared`] what every request's handling shares.

mod answers;
mod client_watch;
mod config;
mod forward;
mod handle;
mod shared;

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

use self::client_watch::ClientWatch;
use self::handle::{handle, Peer};
use self::shared::Shared;
use super::h2_serve;
use super::ledger::Ledger;
use super::listen::{self, Listening};
use super::preface::{self, Protocol};
use crate::error::LabError;
use crate::report::ProxyReport;

pub use self::config::ProxyConfig;

/// A running proxy. Stops when dropped. Its `Debug` shows its address and counts of
/// operations, never their ids.
///
/// # In an SDK's CI
///
/// ```text
/// cargo install retry-safety-lab
/// retry-safety-lab serve --listen 127.0.0.1:4010 &          # or your API's stand-in
/// retry-safety-lab proxy --upstream http://127.0.0.1:4010 --listen 127.0.0.1:8080 \
///     --write 'POST /v1/{*rest}' --op-header x-stainless-retry-id > lab.txt &
/// LAB=$!
/// API_BASE_URL=http://127.0.0.1:8080 TIMEOUT_SECONDS=2 pytest tests/retries   # your SDK's tests
/// kill -INT $LAB; wait $LAB      # exit status 1 if any write reached the upstream twice
/// ```
///
/// Set the SDK's timeout well below the proxy's `--slow-ms` (30 s by default).
///
/// # Limits
///
/// The proxy speaks HTTP/1.1 and HTTP/2 to clients and HTTP/1.1 to the upstream. Bodies are
/// read whole, up to `--max-body` (1 MiB; a longer request gets 413 and is not counted; a
/// longer answer gets the client a 502, the attempt counted as sent with no answer). It keeps
/// one entry per operation until it stops.
pub struct Proxy {
    addr: SocketAddr,
    ledger: Arc<Ledger>,
    listening: Listening,
}

impl fmt::Debug for Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Proxy")
            .field("addr", &self.addr)
            .field("ledger", &self.ledger)
            .finish_non_exhaustive()
    }
}

impl Proxy {
    /// Checks that the upstream accepts connections, then listens on `addr`. Errors name the
    /// input: the upstream, or the address.
    pub async fn start(config: ProxyConfig, addr: SocketAddr) -> Result<Proxy, LabError> {
        check_reachable(&config).await?;
        let listener = listen::bind("--listen", addr).await?;
        let addr = listener
            .local_addr()
            .map_err(|err| LabError::new("--listen", err.to_string()))?;
        let ledger = Arc::new(Ledger::new(config.faults.clone()));
        let shared = Arc::new(Shared {
            config,
            ledger: ledger.clone(),
            client: Client::builder(TokioExecutor::new()).build_http(),
            reported: AtomicBool::new(false),
        });
        let listening =
            listen::serve_connections(listener, move |tcp| serve_connection(shared.clone(), tcp));
        Ok(Proxy {
            addr,
            ledger,
            listening,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Client connections being served now. A test that closed its connections waits for
    /// 0 to know that every answer was given, or counted as not received.
    pub fn open_connections(&self) -> usize {
        self.listening.open()
    }

    /// The counts so far. An attempt handed to the upstream counts from that moment, answered
    /// or not; one still at the upstream is also counted in `pending`.
    pub fn report(&self) -> ProxyReport {
        self.ledger.report()
    }

    /// Stops accepting connections and forwarding: a request that arrives later (on a
    /// connection already open) is answered 503 and not counted, not being sent.
    pub fn stop(&self) {
        self.ledger.close();
        self.listening.stop_accepting();
    }

    /// [`stop`](Proxy::stop)s, then waits until no attempt is at the upstream, at most
    /// `within`, and reports: an answer that arrives meanwhile may still say an attempt ran
    /// nothing. Attempts still at the upstream then are counted in `pending` (and as
    /// applied).
    pub async fn drain(&self, within: Duration) -> ProxyReport {
        self.stop();
        self.ledger.settle(within).await;
        self.ledger.report()
    }
}

async fn check_reachable(config: &ProxyConfig) -> Result<(), LabError> {
    let unreachable = |reason: String| {
        LabError::new(
            "--upstream",
            format!("{} is unreachable: {reason}", config.upstream_display),
        )
    };
    let authority = config
        .upstream
        .authority()
        .ok_or_else(|| unreachable("no host".to_owned()))?;
    let port = authority.port_u16().unwrap_or(80);
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let connect = tokio::net::TcpStream::connect((host, port));
    match tokio::time::timeout(Duration::from_secs(5), connect).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(err)) => Err(unreachable(err.to_string())),
        Err(_) => Err(unreachable("no answer in 5 s".to_owned())),
    }
}

/// A client's connection: HTTP/1.1 through hyper, HTTP/2 through h2, as its first bytes say.
async fn serve_connection(shared: Arc<Shared>, tcp: TcpStream) {
    match preface::sniff(&tcp).await {
        Ok(Protocol::Http2) => {
            let grace = shared.config.slow;
            let handler = move |req, stream| handle(shared.clone(), req, Peer::Http2(stream));
            h2_serve::serve(tcp, handler, grace).await;
        }
        Ok(Protocol::Http1) => {
            let Ok((tcp, watch)) = ClientWatch::split(tcp) else {
                return;
            };
            let watch = Arc::new(watch);
            let svc = service_fn(move |req| {
                let handling = handle(shared.clone(), req, Peer::Http1(watch.clone()));
                // HTTP/1.1 has no stream to reset nor GOAWAY: hyper closes the connection.
                async move { handling.await.map_err(|_| ConnectionClosed) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        }
        Err(_) => {}
    }
}

/// hyper's error for an HTTP/1.1 request the proxy does not answer: it closes the connection.
#[derive(Debug)]
struct ConnectionClosed;

impl fmt::Display for ConnectionClosed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the fault lab closed the connection")
    }
}

impl std::error::Error for ConnectionClosed {}
