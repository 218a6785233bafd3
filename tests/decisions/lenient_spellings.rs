//! End to end, through real sockets: spellings of a host or a path that reach the handler a
//! rule names must get that rule's verdict. Each server applies a write, then loses the
//! response to its first attempt; it counts writes per resource as it routes them.
//!
//! - Hosts: a trailing-dot name (`api.example.com.`, the same host to DNS and TLS), an IPv6
//!   literal written long (`[0:0:0:0:0:0:0:1]` for `[::1]`), an IPv4 shorthand (`127.1`).
//! - Paths: `;parameters` in a segment (servlet containers cut them before routing), `%2F`
//!   (WSGI servers decode it), `\` (IIS reads it as `/`).
//!
//! Each case has a control, the same request to a resource no rule names, retried and so
//! applied twice: the fault is real, and only the rule keeps the write from repeating.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{Layer, ServiceExt};
use tower_retry_safety::{Idempotency, RetryPolicy, RetryReport};

type Ledger = Arc<Mutex<HashMap<String, u32>>>;

/// How a server reads a request's path before routing it.
#[derive(Clone, Copy)]
enum Router {
    /// As sent.
    Plain,
    /// Tomcat, Jetty, Spring: `;parameters` cut from each segment.
    Servlet,
    /// gunicorn with Flask or Django: the path percent-decoded (`%2F` is a `/`).
    Wsgi,
    /// IIS: `\` read as `/`.
    Iis,
}

impl Router {
    fn route(self, path: &str) -> String {
        match self {
            Router::Plain => path.to_owned(),
            Router::Servlet => path
                .split('/')
                .map(|segment| segment.split(';').next().unwrap_or(""))
                .collect::<Vec<_>>()
                .join("/"),
            Router::Wsgi => {
                let mut out = Vec::new();
                let bytes = path.as_bytes();
                let mut i = 0;
                while i < bytes.len() {
                    if bytes[i] == b'%' {
                        if let Some(b) = path
                            .get(i + 1..i + 3)
                            .and_then(|h| u8::from_str_radix(h, 16).ok())
                        {
                            out.push(b);
                            i += 3;
                            continue;
                        }
                    }
                    out.push(bytes[i]);
                    i += 1;
                }
                String::from_utf8_lossy(&out).into_owned()
            }
            Router::Iis => path.replace('\\', "/"),
        }
    }
}

async fn serve(bind: IpAddr, router: Router) -> (u16, Ledger) {
    let listener = TcpListener::bind(SocketAddr::new(bind, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let ledger = Ledger::default();
    let shared = ledger.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let ledger = shared.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let ledger = ledger.clone();
                    async move {
                        let applied = {
                            let mut ledger = ledger.lock().unwrap();
                            let n = ledger.entry(router.route(req.uri().path())).or_default();
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

/// Resolves every name to 127.0.0.1, as DNS would for the API's host.
#[derive(Clone)]
struct ToLoopback;

impl tower::Service<Name> for ToLoopback {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Name) -> Self::Future {
        let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
        Box::pin(async move { Ok(vec![addr].into_iter()) })
    }
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

type Svc = tower_retry_safety::RetrySafety<Client<HttpConnector<ToLoopback>, Full<Bytes>>>;

fn client(policy: &RetryPolicy) -> Svc {
    let mut http = HttpConnector::new_with_resolver(ToLoopback);
    http.enforce_http(true);
    policy.layer(Client::builder(TokioExecutor::new()).build(http))
}

/// Sends a PUT that the server applies and whose response it loses; returns how often the
/// server applied it.
async fn applied(svc: &Svc, ledger: &Ledger, url: String, routed: &str) -> u32 {
    let _ = svc.clone().oneshot(put(url)).await;
    ledger.lock().unwrap().get(routed).copied().unwrap_or(0)
}

async fn check(svc: &Svc, ledger: &Ledger, url: String, routed: &str) {
    let n = applied(svc, ledger, url.clone(), routed).await;
    assert_eq!(n, 1, "{url}: applied {n} times, routed as {routed}");
}

async fn control(svc: &Svc, ledger: &Ledger, url: String, routed: &str) {
    let res = svc.clone().oneshot(put(url.clone())).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.extensions().get::<RetryReport>().unwrap().attempts(), 2);
    let n = ledger.lock().unwrap().get(routed).copied().unwrap_or(0);
    assert_eq!(n, 2, "{url}: the control is applied twice");
}

#[tokio::test]
async fn a_host_rule_holds_for_a_trailing_dot_and_ip_spellings() {
    let (port, ledger) = serve(IpAddr::V4(Ipv4Addr::LOCALHOST), Router::Plain).await;
    let send = |host: &str| format!("http://{host}:{port}/v1/send/m1");
    let svc = client(&policy(|b| {
        b.route_for_host(
            "api.example.com",
            Method::PUT,
            "/v1/send/{id}",
            Idempotency::NonIdempotent,
        )
        .route_for_host(
            "127.0.0.1",
            Method::PUT,
            "/v2/send/{id}",
            Idempotency::NonIdempotent,
        )
    }));
    check(&svc, &ledger, send("api.example.com."), "/v1/send/m1").await;
    check(
        &svc,
        &ledger,
        send("API.Example.com.").replace("m1", "m2"),
        "/v1/send/m2",
    )
    .await;
    check(
        &svc,
        &ledger,
        format!("http://127.1:{port}/v2/send/m3"),
        "/v2/send/m3",
    )
    .await;
    check(
        &svc,
        &ledger,
        format!("http://0x7f.0.0.1:{port}/v2/send/m4"),
        "/v2/send/m4",
    )
    .await;
    // Control: another host's rule does not apply, and the PUT is retried by its method.
    control(
        &svc,
        &ledger,
        send("other.example.com").replace("m1", "c1"),
        "/v1/send/c1",
    )
    .await;
}

#[tokio::test]
async fn a_host_rule_for_ipv6_holds_for_the_long_form() {
    let (port, ledger) = serve("::1".parse().unwrap(), Router::Plain).await;
    let svc = policy(|b| {
        b.route_for_host(
            "[::1]",
            Method::PUT,
            "/v1/send/{id}",
            Idempotency::NonIdempotent,
        )
    })
    .layer(Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>());
    let url = |host: &str, id: &str| format!("http://{host}:{port}/v1/send/{id}");
    for (host, id) in [
        ("[0:0:0:0:0:0:0:1]", "m1"),
        ("[0000::1]", "m2"),
        ("[::1]", "m3"),
    ] {
        let _ = svc.clone().oneshot(put(url(host, id))).await;
        let n = ledger
            .lock()
            .unwrap()
            .get(&format!("/v1/send/{id}"))
            .copied();
        assert_eq!(n, Some(1), "{host}: applied once");
    }
    // Control: a path the rule does not name is retried, so applied twice.
    let res = svc
        .clone()
        .oneshot(put(format!("http://[0:0:0:0:0:0:0:1]:{port}/v1/other/c1")))
        .await
        .unwrap();
    assert_eq!(res.extensions().get::<RetryReport>().unwrap().attempts(), 2);
    assert_eq!(ledger.lock().unwrap().get("/v1/other/c1").copied(), Some(2));
}

#[tokio::test]
async fn a_path_rule_holds_for_segment_parameters() {
    let (port, ledger) = serve(IpAddr::V4(Ipv4Addr::LOCALHOST), Router::Servlet).await;
    let svc = client(&policy(|b| {
        b.route(Method::PUT, "/v1/send/{id}", Idempotency::NonIdempotent)
    }));
    let url = |path: &str| format!("http://127.0.0.1:{port}{path}");
    check(&svc, &ledger, url("/v1/send;v=1/m2"), "/v1/send/m2").await;
    check(
        &svc,
        &ledger,
        url("/v1;a=b/send;jsessionid=x/m3"),
        "/v1/send/m3",
    )
    .await;
    control(&svc, &ledger, url("/v1/other;v=1/c1"), "/v1/other/c1").await;
}

#[tokio::test]
async fn a_path_rule_holds_for_an_encoded_slash() {
    let (port, ledger) = serve(IpAddr::V4(Ipv4Addr::LOCALHOST), Router::Wsgi).await;
    let svc = client(&policy(|b| {
        b.route(Method::PUT, "/v1/send/{id}", Idempotency::NonIdempotent)
    }));
    let url = |path: &str| format!("http://127.0.0.1:{port}{path}");
    check(&svc, &ledger, url("/v1%2Fsend/m3"), "/v1/send/m3").await;
    check(&svc, &ledger, url("/v1%2fsend%2Fm4"), "/v1/send/m4").await;
    control(&svc, &ledger, url("/v1%2Fother/c1"), "/v1/other/c1").await;
}

#[tokio::test]
async fn a_path_rule_holds_for_a_backslash() {
    let (port, ledger) = serve(IpAddr::V4(Ipv4Addr::LOCALHOST), Router::Iis).await;
    let svc = client(&policy(|b| {
        b.route(Method::PUT, "/v1/send/{id}", Idempotency::NonIdempotent)
    }));
    let url = |path: &str| format!("http://127.0.0.1:{port}{path}");
    check(&svc, &ledger, url("/v1\\send/m5"), "/v1/send/m5").await;
    control(&svc, &ledger, url("/v1\\other/c1"), "/v1/other/c1").await;
}

/// Key trust and host rules look the host up in the same canonical form, and a setting may
/// name what a user holds: a base URL, or an authority with a port (that port only).
#[test]
fn key_trust_and_settings_take_every_spelling() {
    let policy = RetryPolicy::builder()
        .honor_idempotency_key_for_host("https://API.example.com:443/v1/")
        .route_for_host(
            "localhost:8080",
            Method::POST,
            "/v1/search",
            Idempotency::Idempotent,
        )
        .build()
        .unwrap();
    let keyed = |url: &str| {
        let mut req = Request::post(url)
            .header("idempotency-key", "\"k-1\"")
            .body(())
            .unwrap();
        req.extensions_mut().insert(Idempotency::NonIdempotent);
        policy.classify(&req).keys_honored()
    };
    assert!(keyed("https://api.example.com/v1/send"));
    assert!(keyed("https://api.example.com./v1/send"));
    assert!(keyed("http://api.example.com:8080/v1/send"));
    assert!(!keyed("https://api.example.org/v1/send"));
    let search = |url: &str| {
        let req = Request::post(url).body(()).unwrap();
        policy.classify(&req).idempotency()
    };
    assert_eq!(
        search("http://localhost:8080/v1/search"),
        Idempotency::Idempotent
    );
    assert_eq!(
        search("http://localhost.:8080/v1/search"),
        Idempotency::Idempotent
    );
    assert_eq!(
        search("http://localhost:9090/v1/search"),
        Idempotency::NonIdempotent
    );
    assert_eq!(
        search("http://localhost/v1/search"),
        Idempotency::NonIdempotent
    );
    for bad in [
        "api.example.com/v1",
        "https://user:secret@api.example.com",
        "",
    ] {
        let err = RetryPolicy::builder()
            .honor_idempotency_key_for_host(bad)
            .build()
            .unwrap_err();
        assert_eq!(err.setting_name(), "honor_idempotency_key_for_host");
        assert!(!err.to_string().contains("user:secret"), "{err}");
    }
}
