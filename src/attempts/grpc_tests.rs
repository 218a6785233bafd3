//! gRPC calls through `Attempts` alone, with no runtime: the class of a trailers-only
//! status decides the step, and each attempt carries `grpc-timeout` and
//! `grpc-previous-rpc-attempts`.

use std::time::Duration;

use http::{Extensions, HeaderMap, HeaderValue, Method, Request, StatusCode};

use super::{Attempts, Outcome, Plan, Step};
use crate::classify::grpc::{parse_timeout, GRPC_TIMEOUT, PREVIOUS_ATTEMPTS};
use crate::classify::Idempotency;
use crate::policy::RetryPolicy;
use crate::policy::StopReason;
use crate::target::Target;

fn policy() -> RetryPolicy {
    RetryPolicy::builder()
        .jitter(false)
        .backoff(Duration::from_millis(1), Duration::from_millis(1))
        .max_retries(3)
        .build()
        .unwrap()
}

fn call(idempotency: Option<Idempotency>, timeout: Option<&'static str>) -> Request<()> {
    let mut req = Request::builder()
        .method(Method::POST)
        .uri("http://svc/lab.v1.Ledger/Append")
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    if let Some(t) = timeout {
        req.headers_mut()
            .insert(GRPC_TIMEOUT, HeaderValue::from_static(t));
    }
    if let Some(i) = idempotency {
        req.extensions_mut().insert(i);
    }
    req
}

fn answer(status: Option<&'static str>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/grpc"));
    if let Some(s) = status {
        headers.insert("grpc-status", HeaderValue::from_static(s));
    }
    headers
}

/// The steps for `answers` (one per attempt) and the headers each attempt was sent with.
fn drive(
    policy: &RetryPolicy,
    req: Request<()>,
    answers: &[Option<&'static str>],
) -> (Vec<Step>, Vec<HeaderMap>) {
    let (parts, ()) = req.into_parts();
    let plan = Plan::new(
        policy,
        &parts.method,
        || crate::classify::host::HostSeen::Nothing,
        None,
        parts.uri.path(),
        &parts.headers,
        &parts.extensions,
    );
    let target = Target::from_uri(parts.method.clone(), parts.uri.clone());
    let mut attempts = Attempts::start(policy, plan, target, Ok(()));
    let (mut steps, mut sent) = (Vec::new(), Vec::new());
    for status in answers {
        let mut headers = parts.headers.clone();
        attempts.next_attempt(&mut headers);
        sent.push(headers);
        let response = answer(*status);
        let extensions = Extensions::new();
        let step = attempts.on_outcome(
            Outcome::Response {
                status: StatusCode::OK,
                headers: &response,
                extensions: &extensions,
            },
            Some(Ok(())),
        );
        steps.push(step);
        if matches!(step, Step::Stop(_)) {
            break;
        }
    }
    (steps, sent)
}

const WAIT: Step = Step::Wait(Duration::from_millis(1));

#[test]
fn unavailable_is_retried_for_a_read_and_suppressed_for_a_write() {
    let p = policy();
    let (steps, sent) = drive(
        &p,
        call(Some(Idempotency::Idempotent), None),
        &[Some("14"), Some("14"), Some("0")],
    );
    assert_eq!(steps, [WAIT, WAIT, Step::Stop(StopReason::Final)]);
    assert_eq!(sent[0].get(PREVIOUS_ATTEMPTS), None);
    assert_eq!(sent[1][PREVIOUS_ATTEMPTS], "1");
    assert_eq!(sent[2][PREVIOUS_ATTEMPTS], "2");
    // No deadline anywhere: no grpc-timeout is made up.
    assert!(sent.iter().all(|h| h.get(GRPC_TIMEOUT).is_none()));

    let (steps, _) = drive(&p, call(None, None), &[Some("14"), Some("0")]);
    assert_eq!(steps, [Step::Stop(StopReason::SuppressedNotIdempotent)]);
}

#[test]
fn a_call_with_messages_is_committed() {
    let (steps, _) = drive(
        &policy(),
        call(Some(Idempotency::Idempotent), None),
        &[None, Some("0")],
    );
    assert_eq!(steps, [Step::Stop(StopReason::Final)]);
}

#[test]
fn the_callers_timeout_is_the_deadline_and_each_attempt_gets_what_is_left() {
    let (steps, sent) = drive(
        &policy(),
        call(Some(Idempotency::Idempotent), Some("5S")),
        &[Some("14"), Some("0")],
    );
    assert_eq!(steps, [WAIT, Step::Stop(StopReason::Final)]);
    let first = parse_timeout(&sent[0][GRPC_TIMEOUT]).unwrap();
    let second = parse_timeout(&sent[1][GRPC_TIMEOUT]).unwrap();
    assert!(first <= Duration::from_secs(5), "{first:?}");
    assert!(second <= first, "{second:?} after {first:?}");
    // The policy's shorter deadline wins over the caller's.
    let short = RetryPolicy::builder()
        .deadline(Duration::from_secs(1))
        .build()
        .unwrap();
    let (_, sent) = drive(&short, call(None, Some("5S")), &[Some("0")]);
    let first = parse_timeout(&sent[0][GRPC_TIMEOUT]).unwrap();
    assert!(first <= Duration::from_secs(1), "{first:?}");
}

#[test]
fn a_pushback_longer_than_the_time_left_stops_on_the_deadline() {
    let p = RetryPolicy::builder()
        .max_retry_after(Duration::from_secs(60))
        .build()
        .unwrap();
    let (parts, ()) = call(Some(Idempotency::Idempotent), Some("50m")).into_parts();
    let plan = Plan::new(
        &p,
        &parts.method,
        || crate::classify::host::HostSeen::Nothing,
        None,
        parts.uri.path(),
        &parts.headers,
        &parts.extensions,
    );
    let target = Target::from_uri(parts.method.clone(), parts.uri.clone());
    let mut attempts = Attempts::start(&p, plan, target, Ok(()));
    attempts.next_attempt(&mut HeaderMap::new());
    let mut response = answer(Some("14"));
    response.insert("grpc-retry-pushback-ms", HeaderValue::from_static("1000"));
    let step = attempts.on_outcome(
        Outcome::Response {
            status: StatusCode::OK,
            headers: &response,
            extensions: &Extensions::new(),
        },
        Some(Ok(())),
    );
    assert_eq!(step, Step::Stop(StopReason::Deadline));
}
