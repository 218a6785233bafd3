//! The key conformance check against an API that needs credentials and its own payload:
//! `--header` and `--body` let every rule be tried, and neither the credential nor the body
//! is ever shown.

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use retry_safety_lab::{KeysCheck, RuleVerdict, Upstream};
use tokio::net::TcpListener;

const TOKEN: &str = "Bearer s3cret-token-Zq81";
/// The payload field the API insists on.
const FIELD: &str = "\"amount\":100";

fn loopback() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, 0))
}

/// The lab's own keyed upstream behind a gate, as an API is: 401 without the token, 400
/// without its payload's field; otherwise the request (its headers, the key's among them)
/// goes to the upstream and its answer (the run header among them) comes back.
async fn gated_api() -> (Upstream, SocketAddr) {
    let upstream = Upstream::start(loopback()).await.expect("upstream");
    let behind = format!("http://{}", upstream.addr());
    let listener = TcpListener::bind(loopback()).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (client, behind) = (client.clone(), behind.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let (client, behind) = (client.clone(), behind.clone());
                    async move {
                        let (mut parts, body) = req.into_parts();
                        let body = body.collect().await.expect("body").to_bytes();
                        let authorized = parts
                            .headers
                            .get("authorization")
                            .is_some_and(|v| v.as_bytes() == TOKEN.as_bytes());
                        let refused = if !authorized {
                            Some(StatusCode::UNAUTHORIZED)
                        } else if !String::from_utf8_lossy(&body).contains(FIELD) {
                            Some(StatusCode::BAD_REQUEST)
                        } else {
                            None
                        };
                        if let Some(status) = refused {
                            let mut res = Response::new(Full::new(Bytes::new()));
                            *res.status_mut() = status;
                            return Ok::<_, Infallible>(res);
                        }
                        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
                        parts.uri = format!("{behind}{path}").parse().expect("uri");
                        parts.headers.remove(http::header::HOST);
                        let res = client
                            .request(Request::from_parts(parts, Full::new(body)))
                            .await
                            .expect("the upstream answers");
                        let (parts, body) = res.into_parts();
                        let body = body.collect().await.expect("body").to_bytes();
                        Ok(Response::from_parts(parts, Full::new(body)))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (upstream, addr)
}

fn check(addr: SocketAddr) -> KeysCheck {
    KeysCheck::new(&format!("http://{addr}"), "POST /v1/payments").expect("valid check")
}

/// With the API's credential and a payload of its shape (`{variant}` making each request's
/// differ), every rule is tried and passes; the credential and the body appear in neither
/// the check's `Debug` nor its output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_with_credentials_passes_every_rule_with_header_and_body() {
    let (upstream, addr) = gated_api().await;
    let check = check(addr)
        .header(&format!("Authorization: {TOKEN}"))
        .expect("a valid header")
        .body(&format!("{{{FIELD},\"description\":\"{{variant}}\"}}"));
    let shown = format!("{check:?}");
    assert!(!shown.contains("s3cret"), "{shown}");
    assert!(!shown.contains("amount"), "{shown}");
    assert!(shown.contains("authorization"), "{shown}");
    let report = check.run().await;
    assert!(report.passed(), "{report}");
    for result in &report.results {
        assert_eq!(result.verdict, RuleVerdict::Pass, "{report}");
    }
    // As over the lab's upstream without the gate: the baseline, the in-flight pair, the
    // other payload's first, the stored response's first, the concurrent burst, the failed
    // run, the two keys differing in case.
    assert_eq!(upstream.handler_runs(), 8, "{report}");
    let output = report.to_string();
    assert!(!output.contains("s3cret"), "{output}");
}

/// The same API without the credential refuses the check's request: nothing can be tried,
/// and the check does not pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_credential_nothing_is_verified() {
    let (upstream, addr) = gated_api().await;
    let report = check(addr)
        .body(&format!("{{{FIELD},\"description\":\"{{variant}}\"}}"))
        .run()
        .await;
    assert!(!report.passed(), "{report}");
    assert!(
        report
            .results
            .iter()
            .all(|r| r.verdict == RuleVerdict::Skip),
        "{report}"
    );
    assert!(report.to_string().contains("401"), "{report}");
    assert_eq!(upstream.handler_runs(), 0);
}

/// A body without `{variant}` sends one payload: the rule that needs another payload for a
/// key is skipped, and the others still pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_without_a_variant_skips_only_the_other_payload_rule() {
    let (_upstream, addr) = gated_api().await;
    let report = check(addr)
        .header(&format!("authorization: {TOKEN}"))
        .expect("a valid header")
        .body(&format!("{{{FIELD}}}"))
        .run()
        .await;
    assert!(report.passed(), "{report}");
    for result in &report.results {
        let want = if result.rule == "other-payload-422" {
            RuleVerdict::Skip
        } else {
            RuleVerdict::Pass
        };
        assert_eq!(result.verdict, want, "{}: {report}", result.rule);
    }
}

/// A header line that is not `NAME: VALUE`, or names a header the check sets, is refused
/// naming `--header`, without echoing the line (it may hold the credential).
#[test]
fn a_bad_header_line_is_refused_without_echoing_it() {
    for line in [
        "Bearer s3cret-token",
        "Authorization Bearer s3cret-token: x",
        "Idempotency-Key: s3cret-token",
        "content-length: 1",
        // An unset variable (`X-Api-Key: $KEY`).
        "x-api-key: ",
        // A line break inside the value: a second header smuggled in.
        "x-ok: s3cret-token\r\nx-more: 1",
    ] {
        let err = check(SocketAddr::from((Ipv4Addr::LOCALHOST, 1)))
            .header(line)
            .expect_err(line);
        assert_eq!(err.input(), "--header", "{line}");
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains("s3cret"), "{line}: {shown}");
    }
}

/// An API that ignores keys and refuses a payload it has already applied (400, a duplicate,
/// as some APIs do; `x-lab-fail` applies it, then fails): with a `--body` without
/// `{variant}`, every request sends the payload the baseline applied, so the malformed key's
/// 400 and the repeat after a failure not run are the duplicate's doing, not the key's. No
/// rule passes on them. Found by review of the keys check's --header/--body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_refused_as_a_duplicate_passes_no_rule() {
    let listener = TcpListener::bind(loopback()).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Bytes>::new()));
    tokio::spawn(async move {
        let runs = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        while let Ok((stream, _)) = listener.accept().await {
            let (seen, runs) = (seen.clone(), runs.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let (seen, runs) = (seen.clone(), runs.clone());
                    async move {
                        let fail = req.headers().contains_key("x-lab-fail");
                        let body = req.into_body().collect().await.expect("body").to_bytes();
                        let duplicate = {
                            let mut seen = seen.lock().expect("lock");
                            let duplicate = seen.contains(&body);
                            seen.push(body);
                            duplicate
                        };
                        let mut res = Response::new(Full::new(Bytes::new()));
                        if fail {
                            *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                        } else if duplicate {
                            *res.status_mut() = StatusCode::BAD_REQUEST;
                        } else {
                            let run = runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            res.headers_mut()
                                .insert("x-lab-handler-run", http::HeaderValue::from(run));
                        }
                        Ok::<_, Infallible>(res)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    let report = check(addr).body("{\"amount\":100}").run().await;
    for result in &report.results {
        assert_ne!(
            result.verdict,
            RuleVerdict::Pass,
            "{}: {report}",
            result.rule
        );
    }
    assert!(!report.passed(), "{report}");
}
