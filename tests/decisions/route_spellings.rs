//! End to end: a `NonIdempotent` route rule holds for every spelling of a path that a server
//! routes to the same handler. The server here normalises paths (unreserved escapes decoded,
//! dot and empty segments removed, lower case) before routing, counts side effects per message
//! id, and loses the response to each message's first attempt after applying it.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{Layer, ServiceExt};
use tower_retry_safety::{FailureClass, Idempotency, RetryPolicy, RetryReport};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Effects {
    attempts: u32,
    applied: u32,
}

type Ledger = Arc<Mutex<HashMap<String, Effects>>>;

/// The path as this server routes it. Written apart from the crate's own normalisation, from
/// RFC 3986 §6.2.2 and §5.2.4, so that the two are checked against each other.
fn routed_path(path: &str) -> String {
    let mut decoded = String::new();
    let mut rest = path;
    while let Some(i) = rest.find('%') {
        decoded.push_str(&rest[..i]);
        let escaped = rest
            .get(i + 1..i + 3)
            .filter(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|hex| u8::from_str_radix(hex, 16).ok())
            .map(char::from)
            .filter(|c| c.is_ascii_alphanumeric() || "-._~".contains(*c));
        match escaped {
            Some(c) => {
                decoded.push(c);
                rest = &rest[i + 3..];
            }
            None => {
                decoded.push('%');
                rest = &rest[i + 1..];
            }
        }
    }
    decoded.push_str(rest);
    let mut segments = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    format!("/{}", segments.join("/")).to_ascii_lowercase()
}

/// `/v1/send/{id}` is one resource per id; any other path is its own resource.
fn resource(path: &str) -> String {
    let routed = routed_path(path);
    match routed.strip_prefix("/v1/send/") {
        Some(id) if !id.contains('/') => id.to_owned(),
        _ => routed,
    }
}

async fn handle(
    ledger: Ledger,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, io::Error> {
    let first = {
        let mut ledger = ledger.lock().unwrap();
        let effects = ledger.entry(resource(req.uri().path())).or_default();
        effects.attempts += 1;
        if req.method() != Method::GET {
            effects.applied += 1;
        }
        effects.attempts == 1
    };
    if first {
        // Applied, then lost: a service error makes hyper close the connection unanswered.
        return Err(io::Error::other("drop the response"));
    }
    Ok(Response::new(Full::new(Bytes::from_static(b"sent"))))
}

async fn server() -> (SocketAddr, Ledger) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ledger = Ledger::default();
    let shared = ledger.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let ledger = shared.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| handle(ledger.clone(), req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, ledger)
}

fn put(addr: SocketAddr, path: &str) -> Request<Full<Bytes>> {
    Request::put(format!("http://{addr}{path}"))
        .body(Full::new(Bytes::from_static(b"{\"to\":\"a@example.com\"}")))
        .unwrap()
}

#[test]
fn the_server_routes_every_spelling_to_one_message() {
    for (path, id) in [
        ("/v1/send/m0", "m0"),
        ("/v1/send/m1/", "m1"),
        ("/v1/%73end/m2", "m2"),
        ("/v1/SEND/m3", "m3"),
        ("/v1//send/m4", "m4"),
        ("/v1/./send/m5", "m5"),
        ("/v1/x/../send/M6", "m6"),
    ] {
        assert_eq!(resource(path), id, "{path}");
    }
    assert_eq!(resource("/v1%2Fsend/m7"), "/v1%2fsend/m7");
}

#[tokio::test]
async fn a_send_is_applied_once_whatever_the_spelling_of_its_path() {
    let (addr, ledger) = server().await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let policy = RetryPolicy::builder()
        .route(Method::PUT, "/v1/send/{id}", Idempotency::NonIdempotent)
        .max_retries(2)
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .no_budget()
        .build()
        .unwrap();
    let svc = policy.layer(client);

    let spellings = [
        ("/v1/send/m0", "m0"),
        ("/v1/send/m1/", "m1"),
        ("/v1/%73end/m2", "m2"),
        ("/v1/SEND/m3", "m3"),
        ("/v1//send/m4", "m4"),
        ("/v1/./send/m5", "m5"),
    ];
    for (path, id) in spellings {
        let err = svc.clone().oneshot(put(addr, path)).await.unwrap_err();
        assert!(err.is_ambiguous(), "{path}: {err:?}");
        assert!(err.retry_suppressed(), "{path}: {err:?}");
        assert_eq!(err.attempts(), 1, "{path}");
        assert_eq!(err.failure_class(), Some(FailureClass::Ambiguous), "{path}");
        let effects = ledger.lock().unwrap().get(id).copied().unwrap_or_default();
        assert_eq!(
            effects,
            Effects {
                attempts: 1,
                applied: 1
            },
            "{path}: sent once, applied once"
        );
    }

    // Control: a PUT no rule covers is idempotent by its method and retried after the same
    // fault, so the server applies it twice: the first attempt really is applied.
    let res = svc
        .clone()
        .oneshot(put(addr, "/v1/other/c1"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.extensions().get::<RetryReport>().unwrap().attempts(), 2);
    let ledger = ledger.lock().unwrap();
    assert_eq!(
        ledger.get("/v1/other/c1").copied(),
        Some(Effects {
            attempts: 2,
            applied: 2
        })
    );
    // Nothing else reached the server.
    assert_eq!(ledger.len(), spellings.len() + 1, "{ledger:?}");
}
