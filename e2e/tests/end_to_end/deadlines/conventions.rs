//! The deadlines real clients already send (issue 48, item 7): every convention in the
//! table of `tower_idempotency_keys::deadline`'s docs, over real sockets, through
//! `DeadlineLayer` → `IdempotencyLayer` → a handler that counts its calls and answers the
//! time it was given and whether its caller retries.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;
use tower::{service_fn, ServiceBuilder};
use tower_idempotency_keys::deadline::{DeadlineLayer, DEADLINE_NOTE};
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};
use tower_retry_safety::deadline::Inbound;

use super::loopback::{send, serve, Ledger};

const MAX: Duration = Duration::from_secs(30);

/// The deadline headers of the table, each with a value that names 4 s or less.
const DEADLINES: [(&str, &str); 6] = [
    ("request-timeout-ms", "4000"),
    ("grpc-timeout", "4S"),
    ("connect-timeout-ms", "4000"),
    ("x-envoy-expected-rq-timeout-ms", "4000"),
    ("x-stainless-read-timeout", "3.5"),
    // Whole seconds, truncated: under 4 s.
    ("x-stainless-timeout", "3"),
];

fn server() -> (std::net::SocketAddr, Ledger) {
    let (addr, ledger, _) = server_telling_arrivals();
    (addr, ledger)
}

/// The server, and a signal given as each request reaches the deadline layer (its arrival:
/// the instant its deadline counts from), so that a test can wait past a deadline from it.
fn server_telling_arrivals() -> (std::net::SocketAddr, Ledger, Arc<Notify>) {
    let arrived = Arc::new(Notify::new());
    let signal = arrived.clone();
    let ledger = Ledger::default();
    let calls = ledger.clone();
    let handler = service_fn(move |req: Request<Either<Full<Bytes>, Incoming>>| {
        calls.record(&req);
        let inbound = req.extensions().get::<Inbound>().copied();
        let said = inbound.map_or("none".to_owned(), |i| {
            format!("{} {}", i.remaining().as_millis(), i.caller_retries())
        });
        async move { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(said)))) }
    });
    let svc = ServiceBuilder::new()
        .map_request(move |req: Request<Incoming>| {
            signal.notify_one();
            req
        })
        .layer(DeadlineLayer::new(MAX))
        .layer(IdempotencyLayer::new(MemoryStore::new()))
        .service(handler);
    (serve(svc), ledger, arrived)
}

fn get(addr: std::net::SocketAddr, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut req = Request::get(format!("http://{addr}/work"));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.body(Full::new(Bytes::new())).expect("request")
}

/// The handler's answer: the milliseconds it was given, and whether its caller retries.
fn given(body: &str) -> (u128, bool) {
    let (ms, retries) = body.split_once(' ').expect("an answer of the handler");
    (ms.parse().expect("ms"), retries.parse().expect("bool"))
}

fn notes(res: &Response<()>) -> Vec<String> {
    res.headers()
        .get_all(DEADLINE_NOTE)
        .iter()
        .map(|v| v.to_str().expect("ascii").to_owned())
        .collect()
}

/// issue 48, item 7: each convention alone shortens the deadline from the server's 30 s to
/// what it names; each one's zero has passed on arrival (504, nothing run). Before: only
/// `request-timeout-ms` was read (and `grpc-timeout` on gRPC calls): 5 of 6 handlers were
/// given the 30 s, and 4 of 5 zero deadlines ran their handler and answered 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_convention_alone_shortens_the_deadline() {
    let (addr, ledger) = server();
    let mut not_shortened = Vec::new();
    for (name, value) in DEADLINES {
        let (res, body) = send(get(addr, &[(name, value)])).await;
        assert_eq!(res.status(), StatusCode::OK, "{name}");
        let (ms, _) = given(&body);
        if ms > 4_000 {
            not_shortened.push((name, ms));
        }
    }
    assert_eq!(not_shortened, [], "conventions whose deadline was not read");
    let zeros = [
        ("request-timeout-ms", "0"),
        ("grpc-timeout", "0m"),
        ("connect-timeout-ms", "0"),
        ("x-envoy-expected-rq-timeout-ms", "0"),
        ("x-stainless-read-timeout", "0.0"),
    ];
    let before = ledger.total();
    let mut ran = Vec::new();
    for (name, value) in zeros {
        let (res, _) = send(get(addr, &[(name, value)])).await;
        if res.status() != StatusCode::GATEWAY_TIMEOUT {
            ran.push((name, res.status()));
        }
    }
    assert_eq!(ran, [], "zero deadlines that were not answered 504");
    assert_eq!(ledger.total(), before, "a zero deadline ran nothing");
}

/// issue 48, item 7: with several named, the earliest wins, whatever the order or the
/// convention; one longer than the maximum is capped, and the note names its header.
/// Before: the 2.5 s named by `x-stainless-read-timeout` was ignored (the handler was given
/// the 20 s of `request-timeout-ms`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_earliest_deadline_wins_and_a_longer_one_than_the_maximum_is_capped() {
    let (addr, _) = server();
    let (_, body) = send(get(
        addr,
        &[
            ("request-timeout-ms", "20000"),
            ("x-envoy-expected-rq-timeout-ms", "15000"),
            ("x-stainless-read-timeout", "2.5"),
            ("grpc-timeout", "10S"),
        ],
    ))
    .await;
    assert!(given(&body).0 <= 2_500, "{body}");
    let (res, body) = send(get(addr, &[("x-envoy-expected-rq-timeout-ms", "3600000")])).await;
    assert!(given(&body).0 <= MAX.as_millis(), "{body}");
    assert_eq!(notes(&res), ["capped; x-envoy-expected-rq-timeout-ms"]);
    let (res, _) = send(get(addr, &[("request-timeout-ms", "3600000")])).await;
    assert_eq!(
        notes(&res),
        ["capped"],
        "the own header's note is the bare value"
    );
}

/// issue 48, item 7: a malformed value in each convention is ignored (the handler runs, with
/// the maximum) and the note names its header. Before: no note on any header but
/// `request-timeout-ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_values_are_ignored_and_the_note_names_each() {
    let (addr, ledger) = server();
    let cases = [
        (
            "grpc-timeout",
            "4 seconds",
            "ignored-malformed; grpc-timeout",
        ),
        (
            "connect-timeout-ms",
            "-1",
            "ignored-malformed; connect-timeout-ms",
        ),
        (
            "x-envoy-expected-rq-timeout-ms",
            "1e3",
            "ignored-malformed; x-envoy-expected-rq-timeout-ms",
        ),
        (
            "x-stainless-read-timeout",
            "1e-05",
            "ignored-malformed; x-stainless-read-timeout",
        ),
        (
            "x-stainless-timeout",
            "0.5",
            "ignored-malformed; x-stainless-timeout",
        ),
        (
            "x-stainless-timeout",
            "99999999999",
            "ignored-too-long; x-stainless-timeout",
        ),
        ("request-timeout-ms", "abc", "ignored-malformed"),
        (
            "x-envoy-attempt-count",
            "0",
            "ignored-malformed; x-envoy-attempt-count",
        ),
        (
            "amz-sdk-request",
            "attempt=one",
            "ignored-malformed; amz-sdk-request",
        ),
    ];
    for (name, value, note) in cases {
        let (res, body) = send(get(addr, &[(name, value)])).await;
        assert_eq!(res.status(), StatusCode::OK, "{name}: {value}");
        assert_eq!(notes(&res), [note], "{name}: {value}");
        assert!(given(&body).0 <= MAX.as_millis());
    }
    assert_eq!(ledger.total(), cases.len() as u32);
}

/// issue 48, item 7: an attempt number in any convention says the caller retries (a
/// Stainless SDK's `0` too: only its retry loop sends it); AWS's `max=1` says it does not.
/// Before: only `request-attempt` was read on an HTTP request (4 of 5 retrying callers
/// were taken for callers that do not retry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_number_in_any_convention_says_the_caller_retries() {
    let (addr, _) = server();
    let cases = [
        (("request-attempt", "1"), true),
        (("grpc-previous-rpc-attempts", "1"), true),
        (("x-envoy-attempt-count", "1"), true),
        (("x-stainless-retry-count", "0"), true),
        (("amz-sdk-request", "attempt=1; max=3"), true),
        (("amz-sdk-request", "attempt=1; max=1"), false),
        (("x-unrelated", "1"), false),
    ];
    let mut wrong = Vec::new();
    for (header, retries) in cases {
        let (_, body) = send(get(addr, &[header])).await;
        if given(&body).1 != retries {
            wrong.push(header);
        }
    }
    assert_eq!(wrong, [], "attempt headers read wrong");
}

/// issue 48, item 7: `x-stainless-timeout: 0` is OpenAI's Node SDK's truncated "under a
/// second": the handler runs, given a second at most. A keyed request with the same header
/// whose body comes 1.5 s after it arrived has run out of it: 504, nothing run. Before: the
/// header was not read, and the handler was given the server's 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stainless_timeout_of_zero_seconds_means_under_one() {
    let (addr, ledger, arrived) = server_telling_arrivals();
    let (res, body) = send(get(addr, &[("x-stainless-timeout", "0")])).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert!(given(&body).0 <= 1_000, "{body}");
    assert_eq!(ledger.total(), 1);

    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = "POST /work HTTP/1.1\r\nhost: x\r\nidempotency-key: \"k-node\"\r\n\
                x-stainless-timeout: 0\r\ncontent-length: 2\r\n\r\n{";
    let arrival = arrived.notified();
    stream.write_all(head.as_bytes()).await.expect("head");
    tokio::time::timeout(Duration::from_secs(10), arrival)
        .await
        .expect("the head reached the deadline layer");
    // Its deadline is at most a second after that.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    stream.write_all(b"}").await.expect("body");
    let mut answer = vec![0; 1024];
    let n = stream.read(&mut answer).await.expect("answer");
    let answer = String::from_utf8_lossy(&answer[..n]).into_owned();
    assert!(answer.starts_with("HTTP/1.1 504"), "{answer}");
    assert_eq!(ledger.total(), 1, "the late keyed request ran nothing");
}
