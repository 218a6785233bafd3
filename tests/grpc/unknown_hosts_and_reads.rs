//! Attacks on the host-unknown and may-have-been-applied change (host-scoped rules fail closed
//! when a request shows no host, `RetryPolicy::for_origin`, `may_have_been_applied` false for
//! reads, `MayHaveBeenApplied` for `tonic::Status`). Each test came from the adversarial
//! review of that change; servers are real sockets on 127.0.0.1 and every count is exact.
#![cfg(feature = "tonic")]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::grpc_lab::lab::ledger_client::LedgerClient;
use crate::grpc_lab::lab::Entry;
use crate::support::raw_server::{Act, Raw};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request};
use http_body_util::{Full, StreamBody};
use hyper::body::Frame;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_retry_safety::{
    Idempotency, MayHaveBeenApplied, NoRetry, RetryPolicy, RetryPolicyBuilder, VerdictSource,
};

fn builder() -> RetryPolicyBuilder {
    RetryPolicy::builder()
        .no_budget()
        .jitter(false)
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .max_retries(2)
}

/// A server that reads each request and closes the connection without answering: every
/// attempt is an ambiguous failure (the request reached the server).
async fn closing_server() -> Raw {
    Raw::start(|_, _| vec![Act::Close]).await
}

fn origin_form(method: Method, path: &str) -> http::request::Builder {
    Request::builder().method(method).uri(path)
}

// ---------------------------------------------------------------------------------------
// Classification: spellings of the host, rule precedence, for_origin inputs.
// ---------------------------------------------------------------------------------------

/// From the adversarial review of the host/applied change: with no visible host, a
/// host-scoped `NonIdempotent` rule beats an unscoped `Idempotent` rule for the same route,
/// and a caller's marker still beats both.
#[test]
fn a_host_scoped_write_rule_beats_an_unscoped_idempotent_rule_when_the_host_is_unknown() {
    let policy = builder()
        .route(Method::PUT, "/v1/send", Idempotency::Idempotent)
        .route_for_host(
            "api.test",
            Method::PUT,
            "/v1/send",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    let req = origin_form(Method::PUT, "/v1/send").body(()).unwrap();
    let verdict = policy.classify(&req);
    assert_eq!(verdict.idempotency(), Idempotency::NonIdempotent);
    assert_eq!(verdict.source(), VerdictSource::Route);
    assert!(verdict.host_unknown() && verdict.can_apply());
    // The marker speaks first.
    let mut marked = origin_form(Method::PUT, "/v1/send").body(()).unwrap();
    marked.extensions_mut().insert(Idempotency::Idempotent);
    let verdict = policy.classify(&marked);
    assert_eq!(verdict.idempotency(), Idempotency::Idempotent);
    assert_eq!(verdict.source(), VerdictSource::Marker);
    // Another host, named: the unscoped rule applies.
    let other = origin_form(Method::PUT, "/v1/send")
        .header("host", "other.test")
        .body(())
        .unwrap();
    let verdict = policy.classify(&other);
    assert_eq!(verdict.idempotency(), Idempotency::Idempotent);
    assert!(!verdict.host_unknown());
}

/// From the adversarial review of the host/applied change: a `Host` header the layer cannot
/// read (empty, or bytes that are not visible ASCII) is no host: the write rule holds.
#[test]
fn an_empty_or_unreadable_host_header_is_an_unknown_host() {
    let policy = builder()
        .route_for_host(
            "api.test",
            Method::PUT,
            "/v1/send",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    for value in [
        HeaderValue::from_static(""),
        HeaderValue::from_bytes(b"api.t\xe9st").unwrap(),
    ] {
        let mut req = origin_form(Method::PUT, "/v1/send").body(()).unwrap();
        req.headers_mut().insert("host", value.clone());
        let verdict = policy.classify(&req);
        assert!(verdict.host_unknown(), "{value:?}");
        assert_eq!(
            verdict.idempotency(),
            Idempotency::NonIdempotent,
            "{value:?}"
        );
    }
}

/// From the adversarial review of the host/applied change: the spellings of one host and
/// port in a `Host` header reach the rule scoped to it (IPv6 with a port, uppercase, a
/// trailing dot, an IPv4 shorthand).
#[test]
fn host_header_spellings_reach_a_port_scoped_rule() {
    let policy = builder()
        .route_for_host(
            "[0::1]:8080",
            Method::PUT,
            "/v1/send",
            Idempotency::NonIdempotent,
        )
        .route_for_host(
            "127.0.0.1:8080",
            Method::PUT,
            "/v1/send",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    for host in [
        "[::1]:8080",
        "[0:0:0:0:0:0:0:1]:8080",
        "127.1:8080",
        "127.0.0.1.:8080",
    ] {
        let req = origin_form(Method::PUT, "/v1/send")
            .header("host", host)
            .body(())
            .unwrap();
        let verdict = policy.classify(&req);
        assert_eq!(verdict.idempotency(), Idempotency::NonIdempotent, "{host}");
        assert!(!verdict.host_unknown(), "{host}");
    }
}

/// From the adversarial review of the host/applied change: a `Host` header without a port
/// names the host but not the port (an origin-form request on the scheme's default port
/// omits it, RFC 9110 §7.2). A `NonIdempotent` rule scoped to that host on a port must hold
/// (fail closed: the request may be for that port); before the fix it was skipped and the
/// PUT was called idempotent by its method.
#[test]
fn a_port_scoped_write_rule_holds_when_the_host_header_has_no_port() {
    let policy = builder()
        .route_for_host(
            "api.test:443",
            Method::PUT,
            "/v1/send",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    let req = origin_form(Method::PUT, "/v1/send")
        .header("host", "api.test")
        .body(())
        .unwrap();
    assert_eq!(
        policy.classify(&req).idempotency(),
        Idempotency::NonIdempotent
    );
    // A port-scoped read rule does not apply to an unknown port (also fail closed).
    let read = builder()
        .route_for_host(
            "api.test:443",
            Method::POST,
            "/v1/search",
            Idempotency::Idempotent,
        )
        .build()
        .unwrap();
    let req = origin_form(Method::POST, "/v1/search")
        .header("host", "api.test")
        .body(())
        .unwrap();
    assert_eq!(
        read.classify(&req).idempotency(),
        Idempotency::NonIdempotent
    );
}

/// From the adversarial review of the host/applied change: `for_origin` with a host alone
/// gives no port; a `NonIdempotent` rule scoped to that host on a port must still hold.
#[test]
fn a_port_scoped_write_rule_holds_with_an_origin_without_a_port() {
    let policy = builder()
        .route_for_host(
            "127.0.0.1:50051",
            Method::PUT,
            "/v1/send",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap()
        .for_origin("127.0.0.1")
        .unwrap();
    let req = origin_form(Method::PUT, "/v1/send").body(()).unwrap();
    let verdict = policy.classify(&req);
    assert!(!verdict.host_unknown());
    assert_eq!(verdict.idempotency(), Idempotency::NonIdempotent);
}

/// From the adversarial review of the host/applied change: `for_origin`'s odd inputs. User
/// information is refused without echoing the password; a trailing slash, IPv6 and a default
/// port are taken; a path without a scheme is refused.
#[test]
fn for_origin_takes_base_urls_and_refuses_user_information_without_echoing_it() {
    let policy = builder()
        .route_for_host(
            "127.0.0.1:80",
            Method::PUT,
            "/v1/send",
            Idempotency::NonIdempotent,
        )
        .route_for_host(
            "[::1]:50051",
            Method::PUT,
            "/v1/put",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    let err = policy
        .for_origin("http://user:hunter2@127.0.0.1:50051")
        .unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
    assert!(!format!("{err:?}").contains("hunter2"), "{err:?}");
    assert!(policy.for_origin("127.0.0.1:50051/").is_err());
    assert!(policy.for_origin("").is_err());
    let put = |path: &str| origin_form(Method::PUT, path).body(()).unwrap();
    // The default port of the scheme is the port.
    let default_port = policy.for_origin("http://127.0.0.1/").unwrap();
    assert_eq!(
        default_port.classify(&put("/v1/send")).idempotency(),
        Idempotency::NonIdempotent
    );
    let v6 = policy.for_origin("http://[0:0::1]:50051/").unwrap();
    assert_eq!(
        v6.classify(&put("/v1/put")).idempotency(),
        Idempotency::NonIdempotent
    );
    // A `Host` naming another host than the origin (where the channel sends) leaves the host
    // unknown, and the write rule holds (issue 41, item 1: the header used to outrank it).
    let named = origin_form(Method::PUT, "/v1/put")
        .header("host", "elsewhere.test")
        .body(())
        .unwrap();
    assert_eq!(
        v6.classify(&named).idempotency(),
        Idempotency::NonIdempotent
    );
    assert!(v6.classify(&named).host_unknown());
    // Port 0 and an unspecified address are no origin a channel sends to (issue 41, item 2).
    for bad in [
        "http://127.0.0.1:0",
        "127.0.0.1:0",
        "http://0.0.0.0:50051",
        "ftp://127.0.0.1:1",
    ] {
        assert_eq!(
            policy.for_origin(bad).unwrap_err().setting_name(),
            "for_origin",
            "{bad}"
        );
    }
}

/// From the adversarial review of the host/applied change: a keyed POST whose key is trusted
/// only for a host is not keyed when its host is unknown (no retry after an ambiguous
/// failure), and is with the origin.
#[test]
fn host_scoped_key_trust_does_not_apply_to_an_unknown_host() {
    let policy = builder()
        .honor_idempotency_key_for_host("api.test")
        .build()
        .unwrap();
    let req = || {
        origin_form(Method::POST, "/v1/send")
            .header("idempotency-key", "\"k-1\"")
            .body(())
            .unwrap()
    };
    let verdict = policy.classify(&req());
    assert!(verdict.host_unknown());
    assert!(!verdict.is_keyed());
    assert_eq!(verdict.idempotency(), Idempotency::NonIdempotent);
    let with_origin = policy.for_origin("https://api.test").unwrap();
    let verdict = with_origin.classify(&req());
    assert!(verdict.is_keyed() && !verdict.host_unknown());
}

/// From the adversarial review of the host/applied change: a GET that a rule scoped to a host
/// calls a write can apply when its host is unknown (the rule holds), and a GET no rule names
/// cannot.
#[test]
fn a_get_with_a_host_scoped_write_rule_can_apply_when_its_host_is_unknown() {
    let policy = builder()
        .route_for_host(
            "api.test",
            Method::GET,
            "/v1/trigger",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    let trigger = origin_form(Method::GET, "/v1/trigger").body(()).unwrap();
    let verdict = policy.classify(&trigger);
    assert!(verdict.host_unknown() && verdict.can_apply());
    let read = origin_form(Method::GET, "/v1/other").body(()).unwrap();
    assert!(!policy.classify(&read).can_apply());
}

/// From the adversarial review of the host/applied change: the one-time warning names the
/// method and path only: no query string, no header value.
#[test]
fn the_host_unknown_warning_shows_no_query_or_header_value() {
    let policy = builder()
        .honor_idempotency_key_for_host("api.test")
        .build()
        .unwrap();
    let (logs, ()) = crate::support::logs::capture(|| {
        for _ in 0..3 {
            let req = origin_form(Method::POST, "/v1/send?token=query-secret")
                .header("authorization", "Bearer header-secret")
                .header("idempotency-key", "\"key-secret\"")
                .body(())
                .unwrap();
            assert!(policy.classify(&req).host_unknown());
        }
    });
    assert_eq!(logs.matches("shows no host").count(), 1, "{logs}");
    for secret in ["query-secret", "header-secret", "key-secret", "token="] {
        assert!(!logs.contains(secret), "{secret}: {logs}");
    }
}

// ---------------------------------------------------------------------------------------
// The tower layer and the reqwest middleware on a real socket.
// ---------------------------------------------------------------------------------------

/// From the adversarial review of the host/applied change: the URI names one host (the
/// address connected to) and the `Host` header another (the virtual host the server routes
/// on, and the one that applies the write). A rule scoped to the `Host` header's host that
/// calls the PUT a write must hold: where spellings disagree the stricter verdict wins
/// (DESIGN §2.1). The layer reads only the URI's host, so the PUT is sent 3 times.
#[tokio::test]

async fn a_write_rule_for_the_host_header_holds_when_the_uri_names_another_host() {
    let server = closing_server().await;
    let policy = builder()
        .route_for_host(
            "api.test",
            Method::PUT,
            "/v1/send",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let svc = policy.layer(client);
    let req = Request::put(server.url("/v1/send"))
        .header("host", "api.test")
        .body(Full::new(Bytes::from_static(b"once")))
        .unwrap();
    let err = svc.oneshot(req).await.unwrap_err();
    let seen = server.seen();
    assert!(
        seen[0].head.to_ascii_lowercase().contains("host: api.test"),
        "the server routes on api.test: {}",
        seen[0].head
    );
    assert!(err.may_have_been_applied(), "{err}");
    assert_eq!(server.requests(), 1, "the write was sent again: {err}");
}

/// From the adversarial review of the host/applied change: the same attack through the
/// reqwest middleware (a `Host` header set on the request, the URL naming the address).
#[tokio::test]

async fn through_reqwest_a_write_rule_for_the_host_header_holds_when_the_url_names_another_host() {
    use reqwest_middleware::ClientBuilder;
    use tower_retry_safety::RetrySafetyMiddleware;

    let server = closing_server().await;
    let policy = builder()
        .route_for_host(
            "api.test",
            Method::PUT,
            "/v1/send",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetrySafetyMiddleware::new(policy))
        .build();
    let err = client
        .put(server.url("/v1/send"))
        .header("host", "api.test")
        .body("once")
        .send()
        .await
        .unwrap_err();
    let seen = server.seen();
    assert!(
        seen[0].head.to_ascii_lowercase().contains("host: api.test"),
        "the server routes on api.test: {}",
        seen[0].head
    );
    assert!(err.may_have_been_applied(), "{err}");
    assert_eq!(server.requests(), 1, "the write was sent again: {err}");
}

/// From the adversarial review of the host/applied change: a `NoRetry` GET is sent once and,
/// failing ambiguously, applied nothing; a `NoRetry` POST in the same cell may have been
/// applied.
#[tokio::test]
async fn a_no_retry_get_applied_nothing_and_a_no_retry_post_may_have_been_applied() {
    let server = closing_server().await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let svc = builder().build().unwrap().layer(client);
    for (method, applied) in [(Method::GET, false), (Method::POST, true)] {
        let before = server.requests();
        let mut req = Request::builder()
            .method(method.clone())
            .uri(server.url("/v1/item"))
            .body(Full::default())
            .unwrap();
        req.extensions_mut().insert(NoRetry);
        let err = svc.clone().oneshot(req).await.unwrap_err();
        assert_eq!(server.requests() - before, 1, "{method}");
        assert!(err.is_ambiguous(), "{method}: {err}");
        assert_eq!(err.may_have_been_applied(), applied, "{method}: {err}");
        assert_eq!(
            err.report().unwrap().may_have_been_applied(),
            applied,
            "{method}"
        );
    }
}

/// From the adversarial review of the host/applied change: a GET that a host-scoped rule
/// calls a write is sent once and may have been applied (the URI shows the host).
#[tokio::test]
async fn a_get_a_host_scoped_rule_calls_a_write_is_sent_once_and_may_have_been_applied() {
    let server = closing_server().await;
    let policy = builder()
        .route_for_host(
            "127.0.0.1",
            Method::GET,
            "/v1/trigger",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let svc = policy.layer(client);
    let req = Request::get(server.url("/v1/trigger"))
        .body(Full::default())
        .unwrap();
    let err = svc.clone().oneshot(req).await.unwrap_err();
    assert_eq!(server.requests(), 1);
    assert!(err.may_have_been_applied(), "{err}");
    // A plain GET on the same server: retried (3 attempts), and applied nothing.
    let req = Request::get(server.url("/v1/read"))
        .body(Full::default())
        .unwrap();
    let err = svc.oneshot(req).await.unwrap_err();
    assert_eq!(server.requests(), 4);
    assert!(err.is_ambiguous() && !err.may_have_been_applied(), "{err}");
}

// ---------------------------------------------------------------------------------------
// gRPC: for_origin without a port, and the `retry-safety-may-have-been-applied` metadata.
// ---------------------------------------------------------------------------------------

type LabClient = LedgerClient<
    tower::util::MapErr<
        tower_retry_safety::RetrySafety<tonic::transport::Channel>,
        fn(tower_retry_safety::Error) -> tonic::Status,
    >,
>;

async fn lab_client(addr: SocketAddr, policy: RetryPolicy) -> LabClient {
    let svc = ServiceBuilder::new()
        .map_err(tonic::Status::from as fn(_) -> _)
        .layer(policy)
        .service(crate::grpc_lab::channel(addr).await);
    LedgerClient::new(svc)
}

fn entry(id: &str) -> Entry {
    Entry {
        id: id.into(),
        payload: vec![1; 4],
    }
}

/// From the adversarial review of the host/applied change: a tonic call through a `Channel`,
/// the layer given `for_origin("127.0.0.1")` (a host, no port) and a rule scoped to
/// `127.0.0.1:<port>` that calls `Put` (IDEMPOTENT in the proto) a write. The server applies
/// each call, then answers UNAVAILABLE. Before the fix the port-scoped rule was skipped (the
/// origin has no port) and each call was applied twice.
#[tokio::test]
async fn a_port_scoped_write_rule_holds_over_a_channel_with_an_origin_without_a_port() {
    let (addr, lab) = crate::grpc_lab::serve().await;
    let policy = builder()
        .grpc_descriptors(&crate::grpc_lab::descriptor_set())
        .route_for_host(
            &addr.to_string(),
            Method::POST,
            "/lab.v1.Ledger/Put",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap()
        .for_origin("127.0.0.1")
        .unwrap();
    let mut client = lab_client(addr, policy).await;
    for i in 0..5 {
        let id = format!("portless-{i}");
        let status = client
            .put(crate::grpc_lab::request(
                entry(&id),
                &id,
                Some(crate::grpc_lab::Fault::UnavailableAfterApply),
            ))
            .await
            .unwrap_err();
        assert!(status.may_have_been_applied(), "{status:?}");
        assert_eq!(lab.applied(&id), 1, "{id}");
    }
    assert_eq!(lab.applied_twice(), 0);
}

/// How a scripted gRPC server answers every call.
#[derive(Clone, Copy)]
enum Answer {
    /// Trailers-only UNAVAILABLE (`content-type: application/grpc`), claiming "not applied".
    TrailersOnly,
    /// Trailers-only UNAVAILABLE without a `content-type`, claiming "not applied".
    TrailersOnlyWithoutContentType,
    /// Headers, then trailers with UNAVAILABLE claiming "not applied".
    Trailers,
}

/// A gRPC server on 127.0.0.1 (HTTP/2, prior knowledge) that counts calls and answers each
/// as `answer` says, putting `retry-safety-may-have-been-applied: false` in its status.
async fn spoofing_server(answer: Answer) -> (SocketAddr, Arc<AtomicU32>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let calls = counted.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_req: Request<_>| {
                    calls.fetch_add(1, Ordering::SeqCst);
                    async move {
                        let mut status = HeaderMap::new();
                        status.insert("grpc-status", HeaderValue::from_static("14"));
                        status.insert("grpc-message", HeaderValue::from_static("gone"));
                        status.insert(
                            "retry-safety-may-have-been-applied",
                            HeaderValue::from_static("false"),
                        );
                        let mut res = http::Response::builder().status(200);
                        if !matches!(answer, Answer::TrailersOnlyWithoutContentType) {
                            res = res.header("content-type", "application/grpc");
                        }
                        let frames: Vec<Result<Frame<Bytes>, Infallible>> = match answer {
                            Answer::Trailers => vec![Ok(Frame::trailers(status))],
                            _ => {
                                for (name, value) in &status {
                                    res = res.header(name, value);
                                }
                                vec![]
                            }
                        };
                        let body = StreamBody::new(futures_util::stream::iter(frames));
                        Ok::<_, Infallible>(res.body(body).unwrap())
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, calls)
}

/// `Append` (a write: no idempotency option in the proto) against the spoofing server.
async fn append_against(answer: Answer) -> (tonic::Status, u32) {
    let (addr, calls) = spoofing_server(answer).await;
    let policy = builder()
        .grpc_descriptors(&crate::grpc_lab::descriptor_set())
        .build()
        .unwrap();
    let mut client = lab_client(addr, policy).await;
    let status = client.append(entry("spoof")).await.unwrap_err();
    (status, calls.load(Ordering::SeqCst))
}

/// From the adversarial review of the host/applied change: a server's trailers-only failure
/// that claims `retry-safety-may-have-been-applied: false` is overwritten by the layer: the
/// write reached the server, so the caller is told it may have been applied.
#[tokio::test]
async fn a_servers_trailers_only_claim_of_not_applied_is_overwritten() {
    let (status, calls) = append_against(Answer::TrailersOnly).await;
    assert_eq!(calls, 1);
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(status.may_have_been_applied(), "{status:?}");
    assert_eq!(status.metadata().get("retry-safety-attempts").unwrap(), "1");
}

/// From the adversarial review of the host/applied change: the same claim in a trailers-only
/// answer without `content-type`. tonic still makes its `Status` from those headers, but the
/// layer marked only answers whose `content-type` is gRPC, so the server's `false` reached
/// the caller: "not applied" for a write the server received. Fixed: the layer marks every
/// failed trailers-only answer to a gRPC call.
#[tokio::test]
async fn a_servers_claim_of_not_applied_without_a_grpc_content_type_is_overwritten() {
    let (status, calls) = append_against(Answer::TrailersOnlyWithoutContentType).await;
    assert_eq!(calls, 1);
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(status.may_have_been_applied(), "{status:?}");
}

/// From the adversarial review of the host/applied change: a failed status in trailers (after
/// the response headers, as a streaming handler's error or a proxy sends it) that claims
/// `retry-safety-may-have-been-applied: false` reaches the caller unchanged: the layer marks
/// only trailers-only answers, and `MayHaveBeenApplied for tonic::Status` believes the
/// metadata, so a write the server received is reported "not applied". The docs say such a
/// status "says nothing the layer knows: true".
#[tokio::test]

async fn a_servers_claim_of_not_applied_in_trailers_is_not_believed() {
    let (status, calls) = append_against(Answer::Trailers).await;
    assert_eq!(calls, 1);
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(status.may_have_been_applied(), "{status:?}");
}
