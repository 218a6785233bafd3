//! `proxy`: the fault-injecting reverse proxy. Each operation's first attempt gets the next
//! fault of its route's turn in the mix; later attempts pass through; the ledger counts
//! what was handed to the upstream (and may have applied) from the moment it is handed.
//! HTTP/1.1 clients are served by hyper, HTTP/2 ones by [`h2_serve`](super::h2_serve) (for
//! its GOAWAY faults); both hand requests to the same [`handle`].

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body::Body as _;
use http_body_util::{BodyExt, Full, Limited};
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

use super::goaway::Stream;
use super::h2_serve;
use super::ledger::{Answer, Attempt, Ledger, Sent};
use super::listen::{self, Listening};
use super::preface::{self, Protocol};
use super::{Fault, LabError, OpIdentity, Report, RouteKinds};
use crate::BoxError;

/// Headers of one hop, never forwarded (RFC 9110 §7.6.1), and `host`, which the proxy's
/// client sets for the upstream.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::HOST,
];

/// What the proxy does and where it forwards.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    upstream: Uri,
    upstream_display: String,
    faults: Vec<Fault>,
    identity: OpIdentity,
    routes: RouteKinds,
    slow: Duration,
    max_body: usize,
    stored_response_header: HeaderName,
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

    /// The response header with which the upstream marks a stored response (a replay, which
    /// ran nothing), for a server that does not use `idempotent-replayed: true`. Its value
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

    fn target(&self, path_and_query: &str) -> Option<Uri> {
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

/// A running proxy. Stops when dropped. Its `Debug` shows its address and counts of
/// operations, never their ids.
pub struct Proxy {
    addr: SocketAddr,
    ledger: Arc<Ledger>,
    listening: Listening,
}

#[derive(Debug)]
struct Shared {
    config: ProxyConfig,
    ledger: Arc<Ledger>,
    client: Client<HttpConnector, Full<Bytes>>,
    /// Whether an upstream failure was reported on stderr (once is enough).
    reported: AtomicBool,
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

    /// The counts so far. An attempt handed to the upstream counts from that moment, answered
    /// or not; one still at the upstream is also counted in `pending`.
    pub fn report(&self) -> Report {
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
    pub async fn drain(&self, within: Duration) -> Report {
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
            let handler = move |req, stream| handle(shared.clone(), req, Some(stream));
            h2_serve::serve(tcp, handler, grace).await;
        }
        Ok(Protocol::Http1) => {
            let svc = service_fn(move |req| {
                let handling = handle(shared.clone(), req, None);
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

/// How a request ends without an answer.
#[derive(Debug)]
pub(crate) enum Unanswered {
    /// HTTP/1.1: the connection is closed. HTTP/2: the stream is reset with the reason
    /// (`INTERNAL_ERROR` when none).
    Dropped(Option<h2::Reason>),
    /// HTTP/2 only: the connection went away (a GOAWAY fault); nothing more is sent on the
    /// stream, and the connection closes.
    GoneAway,
}

const DROPPED: Unanswered = Unanswered::Dropped(None);
/// Not processed (RFC 9113 §8.7): a client may send it again.
const REFUSED: Unanswered = Unanswered::Dropped(Some(h2::Reason::REFUSED_STREAM));

/// hyper's error for an HTTP/1.1 request the proxy does not answer: it closes the connection.
#[derive(Debug)]
struct ConnectionClosed;

impl fmt::Display for ConnectionClosed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the fault lab closed the connection")
    }
}

impl std::error::Error for ConnectionClosed {}

fn text(status: StatusCode, message: &'static str) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(Bytes::from_static(message.as_bytes())));
    *res.status_mut() = status;
    res
}

/// One request, from either server. `stream` is its HTTP/2 stream (`None` for HTTP/1.1),
/// through which it is forwarded only while the connection has not gone away.
async fn handle<B>(
    shared: Arc<Shared>,
    req: Request<B>,
    stream: Option<Stream>,
) -> Result<Response<Full<Bytes>>, Unanswered>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let config = &shared.config;
    let (parts, body) = req.into_parts();
    if parts.method == Method::CONNECT {
        // A tunnel, not a request to forward: its body (the tunnel's bytes) would never end.
        return Ok(text(
            StatusCode::METHOD_NOT_ALLOWED,
            "the fault lab is a reverse proxy: CONNECT is not forwarded\n",
        ));
    }
    let collecting = Limited::new(body, config.max_body).collect();
    let collected = match &stream {
        Some(stream) => tokio::select! {
            biased;
            collected = collecting => collected,
            // A GOAWAY left the stream out before its request arrived whole (its client may
            // never send the rest): not counted, as it cannot be told apart.
            () = stream.refused() => return Err(REFUSED),
        },
        None => collecting.await,
    };
    let body = match collected {
        Ok(body) => body.to_bytes(),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => {
            return Ok(text(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the fault lab reads request bodies up to its --max-body; this one is longer\n",
            ));
        }
        // The client's body broke off: there is no request to forward.
        Err(_) => return Err(DROPPED),
    };
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let op = config
        .identity
        .identify(&parts.method, &path_and_query, &parts.headers, &body);
    let (kind, route) = config.routes.classify(&parts.method, parts.uri.path());
    let Some(attempt) = shared.ledger.begin(op, kind, route) else {
        return Ok(stopping());
    };
    // Counted, never sent: a GOAWAY left the stream out (its client takes it as not processed).
    if stream.as_ref().is_some_and(Stream::is_refused) {
        shared.ledger.answered(&attempt, Answer::Lost);
        return Err(REFUSED);
    }
    let fault = attempt.fault;
    match fault {
        Fault::TooManyRequestsBeforeApply => {
            let mut res = text(StatusCode::TOO_MANY_REQUESTS, "");
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("0"));
            return Ok(answered(&shared, &attempt, res));
        }
        Fault::InternalErrorBeforeApply => {
            let res = text(StatusCode::INTERNAL_SERVER_ERROR, "");
            return Ok(answered(&shared, &attempt, res));
        }
        Fault::ResetBeforeForwarding => {
            shared.ledger.answered(&attempt, Answer::Lost);
            return Err(DROPPED);
        }
        Fault::RefusedStream => {
            shared.ledger.answered(&attempt, Answer::Lost);
            return Err(REFUSED);
        }
        Fault::GoAwayBeforeForwarding => {
            shared.ledger.answered(&attempt, Answer::Lost);
            return Err(match &stream {
                // HTTP/1.1 has no GOAWAY: the connection is closed, as for a reset.
                None => DROPPED,
                Some(stream) if stream.go_away_before_forwarding() => Unanswered::GoneAway,
                // Another stream's GOAWAY came first: refused, as every stream it left out.
                Some(_) => REFUSED,
            });
        }
        _ => {}
    }
    // Forwarded and counted in a task of its own: a client that gives up (the server then
    // drops this future) does not stop a request the upstream may already be running, nor
    // its count.
    let forwarding = tokio::spawn({
        let shared = shared.clone();
        let stream = stream.clone();
        async move {
            // On HTTP/2, only while the connection has not gone away.
            if stream.is_some_and(|s| !s.admit()) {
                return (attempt, None);
            }
            let res = forward(&shared, &attempt, &parts, &path_and_query, body).await;
            (attempt, Some(res))
        }
    });
    let (attempt, res) = forwarding.await.map_err(|_| DROPPED)?;
    let Some(res) = res else {
        // Not forwarded: the GOAWAY leaves the stream unprocessed.
        shared.ledger.answered(&attempt, Answer::Lost);
        return Err(REFUSED);
    };
    let res = match res {
        Ok(res) => res,
        Err(res) => return Ok(answered(&shared, &attempt, res)),
    };
    match fault {
        Fault::DropAfterApply => {
            shared.ledger.answered(&attempt, Answer::Lost);
            Err(DROPPED)
        }
        Fault::GoAwayAfterApply => {
            shared.ledger.answered(&attempt, Answer::Lost);
            match &stream {
                // HTTP/1.1: the connection is closed, as for drop-after-apply.
                None => Err(DROPPED),
                Some(stream) => {
                    stream.go_away_after_apply();
                    Err(Unanswered::GoneAway)
                }
            }
        }
        Fault::SlowAfterApply => {
            // Recorded only if the hold ends before the client gives up (the server drops
            // this future when the client closes the connection or resets the stream).
            tokio::time::sleep(shared.config.slow).await;
            Ok(answered(&shared, &attempt, res))
        }
        Fault::UnavailableAfterApply => {
            let res = text(StatusCode::SERVICE_UNAVAILABLE, "");
            Ok(answered(&shared, &attempt, res))
        }
        _ => Ok(answered(&shared, &attempt, res)),
    }
}

/// The answer to a request that arrives once the proxy stopped: not counted, not sent.
fn stopping() -> Response<Full<Bytes>> {
    let mut res = text(
        StatusCode::SERVICE_UNAVAILABLE,
        "the fault lab is stopping: this request was not forwarded\n",
    );
    res.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    res
}

/// Records what the client is given, and gives it.
fn answered(
    shared: &Shared,
    attempt: &Attempt,
    res: Response<Full<Bytes>>,
) -> Response<Full<Bytes>> {
    shared
        .ledger
        .answered(attempt, Answer::Status(res.status().as_u16()));
    res
}

/// Whether the upstream may have run the request: yes unless its answer says otherwise: a
/// stored response (the replayed header), a refused keyed request (400 malformed, 409 in
/// flight, 422 another payload), or a 429 (RFC 6585 §4: the request was refused for its
/// rate, not processed). A 503, even with `Retry-After`, counts as applied: RFC 9110 does not
/// say a 503 ran nothing, and a handler that failed half-way often answers one.
fn applied(res: &Response<Full<Bytes>>, keyed: bool, stored_header: &HeaderName) -> bool {
    let stored = res
        .headers()
        .get(stored_header)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
    let status = res.status().as_u16();
    let refused = keyed && matches!(status, 400 | 409 | 422);
    let rate_limited = status == 429;
    !stored && !refused && !rate_limited
}

/// Copies the end-to-end headers: not the hop-by-hop ones, nor those the `Connection`
/// header names for this hop (RFC 9110 §7.6.1).
fn copy_headers(from: &HeaderMap, to: &mut HeaderMap) {
    let named: Vec<String> = from
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|token| token.trim().to_ascii_lowercase())
        .filter(|token| !token.is_empty())
        .collect();
    for (name, value) in from {
        if !HOP_BY_HOP.contains(name) && !named.iter().any(|n| n == name.as_str()) {
            to.append(name.clone(), value.clone());
        }
    }
}

/// Sends the request upstream and reads its answer whole, counting the attempt as it goes:
/// handed to the upstream client, it may have applied; only a connect error proves it was
/// not sent, and only a whole answer can say it ran nothing. `Err` is the proxy's own answer
/// when forwarding failed (502), or when the proxy stopped before it was sent (503).
async fn forward(
    shared: &Shared,
    attempt: &Attempt,
    parts: &Parts,
    path_and_query: &str,
    body: Bytes,
) -> Result<Response<Full<Bytes>>, Response<Full<Bytes>>> {
    let config = &shared.config;
    let bad_gateway = |message: &'static str| text(StatusCode::BAD_GATEWAY, message);
    let Some(uri) = config.target(path_and_query) else {
        return Err(bad_gateway(
            "the fault lab cannot forward this request target\n",
        ));
    };
    let mut req = Request::new(Full::new(body));
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = uri;
    // The client may speak HTTP/2 to the proxy; the upstream is spoken to in HTTP/1.1.
    *req.version_mut() = Version::HTTP_11;
    copy_headers(&parts.headers, req.headers_mut());
    // The body is whole: its length is known. An HTTP/2 client sends no content-length for an
    // empty body, and an HTTP/1.1 POST, PUT or PATCH without one is refused by some servers.
    let length = req.body().size_hint().exact().unwrap_or(0);
    if length > 0 || matches!(parts.method, Method::POST | Method::PUT | Method::PATCH) {
        req.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    let keyed = parts.headers.contains_key(config.identity.key_header());
    if !shared.ledger.sending(attempt) {
        return Err(stopping());
    }
    let res = match shared.client.request(req).await {
        Ok(res) => res,
        Err(err) => {
            let how = if err.is_connect() {
                Sent::ConnectFailed
            } else {
                Sent::NoAnswer
            };
            shared.ledger.sent(attempt, how);
            if !shared.reported.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "retry-safety-lab: the upstream {} failed a request: {err} (502 to the client; reported once)",
                    config.upstream_display
                );
            }
            return Err(bad_gateway("the fault lab could not reach the upstream\n"));
        }
    };
    let (head, body) = res.into_parts();
    let body = match Limited::new(body, config.max_body).collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => {
            shared.ledger.sent(attempt, Sent::NoAnswer);
            return Err(bad_gateway(
                "the upstream's answer broke off or is longer than the fault lab's --max-body\n",
            ));
        }
    };
    let mut res = Response::new(Full::new(body));
    *res.status_mut() = head.status;
    copy_headers(&head.headers, res.headers_mut());
    let applied = applied(&res, keyed, &config.stored_response_header);
    shared.ledger.sent(attempt, Sent::Answered { applied });
    Ok(res)
}
