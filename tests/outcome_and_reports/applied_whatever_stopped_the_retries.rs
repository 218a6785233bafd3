//! Whether a request may have been applied does not depend on what stopped its retries: a
//! `NoRetry` marker, a `Retry-After` too long to wait, or a method the `http` crate's version
//! calls safe. Through both HTTP front ends (the tower layer over hyper-util's client, and the
//! reqwest-middleware adapter) against a scripted server on 127.0.0.1 that counts every
//! request it reads.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retry_safety_testing::raw_server::{cl, head, Act, Raw, Seen};
use tower::{Layer, ServiceExt};
use tower_retry_safety::{
    Idempotency, NoRetry, RetryPolicy, RetryPolicyBuilder, RetryReport, RetrySafetyMiddleware,
    StopReason,
};

/// The two HTTP front ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Front {
    Tower,
    Reqwest,
}

const FRONTS: [Front; 2] = [Front::Tower, Front::Reqwest];

/// What the caller was told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Told {
    /// The response's status, `None` for an error.
    status: Option<u16>,
    may_have_been_applied: bool,
    stop: StopReason,
    /// Whether the error's text says "may have been applied" (`false` for a response).
    text_says_applied: bool,
}

/// What a request carries besides its method and URL.
#[derive(Clone, Copy, Default)]
struct Marks {
    no_retry: bool,
    marker: Option<Idempotency>,
}

fn builder() -> RetryPolicyBuilder {
    RetryPolicy::builder()
        .no_budget()
        .jitter(false)
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .max_retries(2)
}

fn told_by_report(status: u16, report: &RetryReport) -> Told {
    Told {
        status: Some(status),
        may_have_been_applied: report.may_have_been_applied(),
        stop: report.stop_reason(),
        text_says_applied: false,
    }
}

fn told_by_error(err: &tower_retry_safety::Error) -> Told {
    Told {
        status: None,
        may_have_been_applied: err.may_have_been_applied(),
        stop: err.stop_reason(),
        text_says_applied: err.to_string().contains("may have been applied"),
    }
}

/// Sends `method url` with a small body through `front` under `policy`.
async fn send(front: Front, policy: RetryPolicy, method: &Method, url: &str, marks: Marks) -> Told {
    let body = Bytes::from_static(b"{\"q\":1}");
    match front {
        Front::Tower => {
            let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
            let mut req = Request::builder()
                .method(method.clone())
                .uri(url)
                .body(Full::new(body))
                .unwrap();
            if marks.no_retry {
                req.extensions_mut().insert(NoRetry);
            }
            if let Some(marker) = marks.marker {
                req.extensions_mut().insert(marker);
            }
            match policy.layer(client).oneshot(req).await {
                Ok(res) => {
                    let told =
                        told_by_report(res.status().as_u16(), RetryReport::of(&res).unwrap());
                    res.into_body().collect().await.unwrap();
                    told
                }
                Err(err) => told_by_error(&err),
            }
        }
        Front::Reqwest => {
            let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
                .with(RetrySafetyMiddleware::new(policy))
                .build();
            let mut req = client.request(method.clone(), url).body(body);
            if marks.no_retry {
                req = req.with_extension(NoRetry);
            }
            if let Some(marker) = marks.marker {
                req = req.with_extension(marker);
            }
            match req.send().await {
                Ok(res) => told_by_report(
                    res.status().as_u16(),
                    RetryReport::of_reqwest(&res).unwrap(),
                ),
                Err(reqwest_middleware::Error::Middleware(err)) => {
                    told_by_error(err.downcast_ref().expect("the middleware's error"))
                }
                Err(other) => panic!("expected the middleware's error, got {other:?}"),
            }
        }
    }
}

/// The server reads each request and closes the connection without an answer: whatever it
/// was, it may have been applied.
fn read_and_close(_: u32, _: &Seen) -> Vec<Act> {
    vec![Act::Close]
}

/// A GET that a route rule (or an `Idempotency::NonIdempotent` marker) calls a write, sent with
/// `NoRetry`; the server reads it and closes the connection. Its error used to answer
/// `may_have_been_applied() == false` while its text said "so it may have been applied"
/// (`NoRetry` decided before the rule and the marker were read). Now both say it may have
/// been applied, on both front ends; one request read each time. A plain GET with `NoRetry`
/// stays a read: applied nothing, and its text does not say otherwise.
///
/// Issue 41 item 4, fifth review.
#[tokio::test]
async fn no_retry_keeps_the_write_verdict_of_a_rule_or_marker() {
    let policy = builder()
        .route(
            Method::GET,
            "/v1/reports/{id}/send",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    let write = Told {
        status: None,
        may_have_been_applied: true,
        stop: StopReason::NoRetryMarker,
        text_says_applied: true,
    };
    let read = Told {
        may_have_been_applied: false,
        text_says_applied: false,
        ..write
    };
    let no_retry = Marks {
        no_retry: true,
        marker: None,
    };
    let marked = Marks {
        marker: Some(Idempotency::NonIdempotent),
        ..no_retry
    };
    let cases = [
        ("rule", "/v1/reports/7/send", no_retry, &write),
        ("marker", "/v1/things/7", marked, &write),
        ("plain read", "/v1/things/7", no_retry, &read),
    ];
    // Per front end and case: (what the caller was told, requests read).
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for front in FRONTS {
        for (case, path, marks, expected) in cases {
            let server = Raw::start(read_and_close).await;
            let told = send(
                front,
                policy.clone(),
                &Method::GET,
                &server.url(path),
                marks,
            )
            .await;
            got.push((front, case, told, server.requests()));
            want.push((front, case, *expected, 1));
        }
    }
    assert_eq!(got, want);
}

/// QUERY is safe and idempotent (a read with a body). It used to be both: the `http` crate's
/// `is_safe()` made it a read, the layer's own list made it a write, so a QUERY whose
/// connection was lost after the server read it was not retried "because it may have been
/// applied" and then reported `may_have_been_applied() == false`. Now it is a read
/// everywhere: retried and recovered (two requests read, 200), and reported applied nothing.
///
/// Issue 41 item 5, fifth review.
#[tokio::test]
async fn query_is_a_read_retried_and_reported_applied_nothing() {
    let query = Method::from_bytes(b"QUERY").unwrap();
    let recovered = Told {
        status: Some(200),
        may_have_been_applied: false,
        stop: StopReason::Final,
        text_says_applied: false,
    };
    let mut got = Vec::new();
    for front in FRONTS {
        let server = Raw::start(|n, _| match n {
            1 => vec![Act::Close],
            _ => {
                let mut answer = head("200 OK", &[cl(2)]);
                answer.extend_from_slice(b"{}");
                vec![Act::W(answer)]
            }
        })
        .await;
        let policy = builder().build().unwrap();
        let url = server.url("/v1/search");
        let told = send(front, policy, &query, &url, Marks::default()).await;
        got.push((front, told, server.requests()));
    }
    assert_eq!(
        got,
        FRONTS.map(|front| (front, recovered, 2)),
        "(told, requests read)"
    );
}

/// A server that answers every request `status` with `Retry-After: 3600`.
async fn answering_with_a_long_wait(status: &'static str) -> Raw {
    Raw::start(move |_, _| vec![Act::W(head(status, &["retry-after: 3600".into(), cl(0)]))]).await
}

/// A POST refused 429 with `Retry-After: 3600`, 429 being a status the policy declares not
/// applied: the wait is too long, so no retry. It used to be reported "may have been
/// applied" (a too-long wait made the response final), while the same 429 with
/// `Retry-After: 0` said "not applied". Now the refusal keeps its class: not applied, on both
/// front ends; one request read, and the stop reason is the wait.
///
/// Issue 41 item 6, fifth review.
#[tokio::test]
async fn a_not_applied_status_with_a_long_retry_after_is_reported_not_applied() {
    let expected = Told {
        status: Some(429),
        may_have_been_applied: false,
        stop: StopReason::RetryAfterTooLong,
        text_says_applied: false,
    };
    let mut got = Vec::new();
    for front in FRONTS {
        let server = answering_with_a_long_wait("429 Too Many Requests").await;
        let policy = builder()
            .not_applied_statuses([StatusCode::TOO_MANY_REQUESTS])
            .build()
            .unwrap();
        let url = server.url("/v1/messages");
        let told = send(front, policy, &Method::POST, &url, Marks::default()).await;
        got.push((front, told, server.requests(), server.writes()));
    }
    let want = FRONTS.map(|front| (front, expected, 1, 1));
    assert_eq!(got, want, "(told, requests read, writes read)");
}

/// A POST answered 503 with `Retry-After: 3600`: the 503 may come after the write, so it is
/// not retried because it may have been applied, whatever the wait. It used to be reported
/// stopped by the wait (`RetryAfterTooLong`, `retry_suppressed() == false`, and counted in
/// `retries.refused` rather than `writes.suppressed`). Now the write's own reason comes first,
/// on both front ends: suppressed, may have been applied, one request read.
///
/// Issue 41 items 6 and 7, fifth review.
#[tokio::test]
async fn a_write_answered_503_with_a_long_retry_after_is_reported_suppressed() {
    let expected = Told {
        status: Some(503),
        may_have_been_applied: true,
        stop: StopReason::SuppressedNotIdempotent,
        text_says_applied: false,
    };
    let mut got = Vec::new();
    for front in FRONTS {
        let server = answering_with_a_long_wait("503 Service Unavailable").await;
        let policy = builder().build().unwrap();
        let url = server.url("/v1/messages");
        let told = send(front, policy, &Method::POST, &url, Marks::default()).await;
        got.push((front, told, server.requests(), server.writes()));
    }
    let want = FRONTS.map(|front| (front, expected, 1, 1));
    assert_eq!(got, want, "(told, requests read, writes read)");
}
