//! Spellings of a host or a path that once escaped a rule, through real sockets on loopback
//! where a write is at stake: each test failed on the commit under review (66b4554) and
//! passes since its fix. From the review of issue 19's fixes.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{Layer, ServiceExt};
use tower_retry_safety::{Idempotency, RetryPolicy};

// ---------------------------------------------------------------------------------------------
// Client side: a server that applies every PUT, and loses the response to the first one.

type Ledger = Arc<Mutex<HashMap<String, u32>>>;

async fn serve_lossy(bind: IpAddr) -> (u16, Ledger) {
    serve_routed(bind, |p| p.to_owned()).await
}

/// As `serve_lossy`, counting writes by the path as `route` reads it.
async fn serve_routed(bind: IpAddr, route: fn(&str) -> String) -> (u16, Ledger) {
    let listener = TcpListener::bind(SocketAddr::new(bind, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let ledger = Ledger::default();
    let shared = ledger.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let ledger = shared.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let ledger = ledger.clone();
                    async move {
                        let applied = {
                            let mut ledger = ledger.lock().unwrap();
                            let n = ledger.entry(route(req.uri().path())).or_default();
                            *n += 1;
                            *n
                        };
                        if applied == 1 {
                            // Applied, then lost: hyper closes the connection unanswered.
                            return Err(io::Error::other("drop the response"));
                        }
                        Ok(Response::new(Full::new(Bytes::from_static(b"sent"))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (port, ledger)
}

fn policy(
    build: impl FnOnce(tower_retry_safety::RetryPolicyBuilder) -> tower_retry_safety::RetryPolicyBuilder,
) -> RetryPolicy {
    build(
        RetryPolicy::builder()
            .max_retries(2)
            .backoff(Duration::from_millis(1), Duration::from_millis(5))
            .no_budget(),
    )
    .build()
    .unwrap()
}

fn put(url: String) -> Request<Full<Bytes>> {
    Request::put(url)
        .body(Full::new(Bytes::from_static(b"{\"to\":\"a@example.com\"}")))
        .unwrap()
}

fn applied(ledger: &Ledger, path: &str) -> u32 {
    ledger.lock().unwrap().get(path).copied().unwrap_or(0)
}

/// An IPv4 literal with more than 12 leading zeros in a part (`0x0000000000007f.0.0.1`) is
/// 127.0.0.1 to the system resolver (glibc's inet_aton) and to the URL standard, but
/// `host::number` gives up past 12 digits, so the rule for 127.0.0.1 is missed and the PUT is
/// applied twice.
///
/// Found by the review of issue 19's fixes.
#[tokio::test]
async fn ipv4_with_many_leading_zeros_escapes_a_host_rule() {
    let (port, ledger) = serve_lossy(IpAddr::V4(Ipv4Addr::LOCALHOST)).await;
    let p = policy(|b| {
        b.route_for_host(
            "127.0.0.1",
            Method::PUT,
            "/v1/send/{id}",
            Idempotency::NonIdempotent,
        )
    });
    // The system resolver (hyper-util's default GaiResolver), as a production client has.
    let svc = p.layer(Client::builder(TokioExecutor::new()).build(HttpConnector::new()));
    // Control: the plain spelling is applied once.
    let _ = svc
        .clone()
        .oneshot(put(format!("http://127.0.0.1:{port}/v1/send/m0")))
        .await;
    assert_eq!(applied(&ledger, "/v1/send/m0"), 1, "the control");
    for (host, id) in [
        ("0x0000000000007f.0.0.1", "m1"),
        ("0000000000000177.0.0.1", "m2"),
        ("0x00000007f000001", "m3"),
    ] {
        let _ = svc
            .clone()
            .oneshot(put(format!("http://{host}:{port}/v1/send/{id}")))
            .await;
        let path = format!("/v1/send/{id}");
        assert_eq!(
            applied(&ledger, &path),
            1,
            "{host}: reached 127.0.0.1 and was applied {} times",
            applied(&ledger, &path)
        );
    }
}

/// An IPv6 literal with a zone id (`[::1%251]`: RFC 6874's `%25` then a numeric zone) is
/// accepted by `http::Uri`, and hyper-util's connector hands `::1%251` to the system resolver,
/// which connects to ::1 (a zone is ignored for a non-link-local address). `canonical` decodes
/// the `%25` but cannot parse `::1%1` as an address, so the rule for `[::1]` is missed and the
/// PUT is applied twice.
///
/// Found by the review of issue 19's fixes.
#[tokio::test]
async fn an_ipv6_zone_id_escapes_a_host_rule() {
    let (port, ledger) = serve_lossy("::1".parse().unwrap()).await;
    let p = policy(|b| {
        b.route_for_host(
            "[::1]",
            Method::PUT,
            "/v1/send/{id}",
            Idempotency::NonIdempotent,
        )
    });
    let svc = p.layer(Client::builder(TokioExecutor::new()).build(HttpConnector::new()));
    let _ = svc
        .clone()
        .oneshot(put(format!("http://[::1]:{port}/v1/send/m0")))
        .await;
    assert_eq!(applied(&ledger, "/v1/send/m0"), 1, "the control");
    let _ = svc
        .clone()
        .oneshot(put(format!("http://[::1%251]:{port}/v1/send/m1")))
        .await;
    let n = applied(&ledger, "/v1/send/m1");
    assert!(
        n > 0,
        "the zoned address did not reach ::1 (the case does not apply here)"
    );
    assert_eq!(n, 1, "[::1%251] reached ::1 and was applied {n} times");
}

/// A tower client over hyper's `client::conn::http1` sends origin-form requests (`/v1/send/m1`
/// plus a `Host` header), as proxies and connection-pool crates do. `Plan` reads the host only
/// from the URI, so a host-scoped `NonIdempotent` rule never matches, the PUT falls back to
/// "idempotent by method" and, after a lost response, is applied twice.
///
/// Found by the review of issue 19's fixes.
#[tokio::test]
async fn a_host_rule_is_missed_for_an_origin_form_request_with_a_host_header() {
    let (port, ledger) = serve_lossy(IpAddr::V4(Ipv4Addr::LOCALHOST)).await;
    let p = policy(|b| {
        b.route_for_host(
            "api.example.com",
            Method::PUT,
            "/v1/send/{id}",
            Idempotency::NonIdempotent,
        )
    });
    // One connection per request, as a minimal origin-form client.
    let connect = tower::service_fn(move |req: Request<Full<Bytes>>| async move {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(io::Error::other)?;
        tokio::spawn(conn);
        send.send_request(req).await.map_err(io::Error::other)
    });
    let svc = p.layer(connect);
    let req = Request::put("/v1/send/m1")
        .header(http::header::HOST, "api.example.com")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let _ = svc.oneshot(req).await;
    assert_eq!(
        applied(&ledger, "/v1/send/m1"),
        1,
        "the PUT to api.example.com (named by its Host header) was applied twice"
    );
}

/// Rails adds `(.:format)` to every route: `PUT /v1/charges/ch_1/capture.json` runs the
/// `capture` action as `/v1/charges/ch_1/capture` does (Spring MVC before 5.3 does the same with
/// suffix pattern matching). No spelling cuts a format suffix, so a `NonIdempotent` rule for a
/// template that ends in a literal is missed and the PUT is applied twice.
///
/// Found by the review of issue 19's fixes.
#[tokio::test]
async fn a_format_suffix_escapes_a_path_rule() {
    /// Rails' router: an optional `.format` after the last segment.
    fn rails(path: &str) -> String {
        let (dir, last) = path.rsplit_once('/').unwrap_or(("", path));
        let last = last.split_once('.').map_or(last, |(name, _)| name);
        format!("{dir}/{last}")
    }
    let (port, ledger) = serve_routed(IpAddr::V4(Ipv4Addr::LOCALHOST), rails).await;
    let p = policy(|b| {
        b.route(
            Method::PUT,
            "/v1/charges/{id}/capture",
            Idempotency::NonIdempotent,
        )
    });
    let svc = p.layer(Client::builder(TokioExecutor::new()).build_http());
    // Control: as written, the rule holds.
    let _ = svc
        .clone()
        .oneshot(put(format!(
            "http://127.0.0.1:{port}/v1/charges/ch_0/capture"
        )))
        .await;
    assert_eq!(
        applied(&ledger, "/v1/charges/ch_0/capture"),
        1,
        "the control"
    );
    let _ = svc
        .clone()
        .oneshot(put(format!(
            "http://127.0.0.1:{port}/v1/charges/ch_1/capture.json"
        )))
        .await;
    assert_eq!(
        applied(&ledger, "/v1/charges/ch_1/capture"),
        1,
        "capture.json was routed to capture and applied twice"
    );
}
