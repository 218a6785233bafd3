//! `Attempts` driven alone, with no runtime and no transport: every step a front end carries
//! out comes from here. Front ends to come (a body resumed, gRPC, hedging) extend these paths.

use std::io::ErrorKind::{ConnectionRefused, TimedOut as IoTimedOut};

use http::{Extensions, HeaderMap, Method, Request, StatusCode};

use super::{Attempts, Outcome, Plan, Step};
use super::{NotReplayable, RetryReport};
use crate::classify::Idempotency;
use crate::classify::NoRetry;
use crate::policy::RetryPolicy;
use crate::policy::StopReason;
use crate::target::Target;

/// How an attempt ends, in these tests.
#[derive(Clone, Copy, Debug)]
enum Ends {
    /// An I/O error of this kind: `ConnectionRefused` is not sent, `TimedOut` ambiguous.
    Err(std::io::ErrorKind),
    /// A response with this status.
    Status(u16),
}

/// The steps `Attempts` takes for a request through `ends` (one per attempt), with `resend`
/// as the front end's answer to "can the body be sent again?", and how it finishes.
fn drive(
    policy: &RetryPolicy,
    req: Request<()>,
    ends: &[Ends],
    resend: Option<Result<(), NotReplayable>>,
) -> (Vec<Step>, Result<RetryReport, crate::attempts::Error>) {
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
    let kept = if resend.is_some() {
        Ok(())
    } else {
        Err(NotReplayable::Stream)
    };
    let target = Target::from_uri(parts.method.clone(), parts.uri.clone());
    let mut attempts = Attempts::start(policy, plan, target, kept);
    let mut steps = Vec::new();
    for (i, end) in ends.iter().enumerate() {
        let mut headers = HeaderMap::new();
        attempts.next_attempt(&mut headers);
        let (headers, extensions) = (HeaderMap::new(), Extensions::new());
        let err;
        let outcome = match *end {
            Ends::Err(kind) => {
                err = std::io::Error::from(kind);
                Outcome::Error(&err)
            }
            Ends::Status(code) => Outcome::Response {
                status: StatusCode::from_u16(code).unwrap(),
                headers: &headers,
                extensions: &extensions,
            },
        };
        let step = attempts.on_outcome(outcome, resend);
        steps.push(step);
        if let Step::Stop(reason) = step {
            assert_eq!(
                i + 1,
                ends.len(),
                "stopped before the last outcome: {steps:?}"
            );
            let result = match *end {
                Ends::Err(kind) => Err(std::io::Error::from(kind).into()),
                Ends::Status(code) => {
                    let mut res = http::Response::new(());
                    *res.status_mut() = StatusCode::from_u16(code).unwrap();
                    Ok(res)
                }
            };
            let finished = attempts.finish(result, reason).map(|res| {
                res.extensions()
                    .get::<RetryReport>()
                    .cloned()
                    .expect("a response carries its report")
            });
            return (steps, finished);
        }
    }
    panic!("no stop after every outcome: {steps:?}")
}

fn policy() -> RetryPolicy {
    RetryPolicy::builder()
        .jitter(false)
        .no_budget()
        .max_retries(2)
        .backoff(
            std::time::Duration::from_millis(10),
            std::time::Duration::from_millis(100),
        )
        .build()
        .unwrap()
}

fn req(method: Method) -> Request<()> {
    Request::builder()
        .method(method)
        .uri("http://api.test/v1/x?secret=1")
        .body(())
        .unwrap()
}

const KEPT: Option<Result<(), NotReplayable>> = Some(Ok(()));

fn waits(steps: &[Step]) -> usize {
    steps.iter().filter(|s| matches!(s, Step::Wait(_))).count()
}

#[test]
fn a_read_is_retried_after_every_kind_of_failure_then_returned() {
    let p = policy();
    for first in [
        Ends::Err(ConnectionRefused),
        Ends::Err(IoTimedOut),
        Ends::Status(503),
    ] {
        let (steps, out) = drive(&p, req(Method::GET), &[first, Ends::Status(200)], KEPT);
        assert_eq!(steps.len(), 2, "{first:?}");
        assert!(matches!(steps[0], Step::Wait(d) if d == std::time::Duration::from_millis(10)));
        assert_eq!(steps[1], Step::Stop(StopReason::Final));
        let report = out.unwrap();
        assert_eq!(report.attempts(), 2);
        assert_eq!(report.stop_reason(), StopReason::Final);
    }
}

#[test]
fn a_write_is_resent_only_when_it_was_not_sent() {
    let p = policy();
    let (steps, out) = drive(
        &p,
        req(Method::POST),
        &[Ends::Err(ConnectionRefused), Ends::Status(201)],
        KEPT,
    );
    assert_eq!(waits(&steps), 1);
    assert_eq!(out.unwrap().attempts(), 2);

    let (steps, out) = drive(&p, req(Method::POST), &[Ends::Err(IoTimedOut)], KEPT);
    assert_eq!(steps, [Step::Stop(StopReason::SuppressedNotIdempotent)]);
    let err = out.unwrap_err();
    assert!(err.is_ambiguous() && err.retry_suppressed());
    assert!(!err.to_string().contains("secret"), "{err}");

    let (steps, out) = drive(&p, req(Method::POST), &[Ends::Status(503)], KEPT);
    assert_eq!(steps, [Step::Stop(StopReason::SuppressedNotIdempotent)]);
    assert_eq!(out.unwrap().attempts(), 1);
}

#[test]
fn retries_end_when_none_are_left_or_the_failure_is_final() {
    let p = policy();
    let ends = [Ends::Status(503), Ends::Status(503), Ends::Status(503)];
    let (steps, out) = drive(&p, req(Method::GET), &ends, KEPT);
    assert_eq!(waits(&steps), 2);
    assert_eq!(steps[2], Step::Stop(StopReason::RetriesExhausted));
    assert_eq!(out.unwrap().attempts(), 3);

    let (steps, out) = drive(&p, req(Method::GET), &[Ends::Status(400)], KEPT);
    assert_eq!(steps, [Step::Stop(StopReason::Final)]);
    assert_eq!(out.unwrap().attempts(), 1);
}

#[test]
fn a_body_that_cannot_be_sent_again_stops_the_retries() {
    let p = policy();
    // Nothing kept to send it with.
    let (steps, out) = drive(&p, req(Method::GET), &[Ends::Status(503)], None);
    assert_eq!(steps, [Step::Stop(StopReason::BodyNotReplayable)]);
    assert_eq!(
        out.unwrap().body_not_replayable(),
        Some(NotReplayable::Stream)
    );
    // Kept, but no longer replayable after this attempt.
    let refused = Some(Err(NotReplayable::ResponseBeforeEnd));
    let (steps, out) = drive(&p, req(Method::GET), &[Ends::Err(IoTimedOut)], refused);
    assert_eq!(steps, [Step::Stop(StopReason::BodyNotReplayable)]);
    assert_eq!(
        out.unwrap_err().report().unwrap().body_not_replayable(),
        Some(NotReplayable::ResponseBeforeEnd)
    );
}

#[test]
fn markers_decide_before_the_method() {
    let p = policy();
    let mut no_retry = req(Method::GET);
    no_retry.extensions_mut().insert(NoRetry);
    let (steps, _) = drive(&p, no_retry, &[Ends::Err(IoTimedOut)], None);
    assert_eq!(steps, [Step::Stop(StopReason::NoRetryMarker)]);

    let mut write = req(Method::PUT);
    write.extensions_mut().insert(Idempotency::NonIdempotent);
    let (steps, _) = drive(&p, write, &[Ends::Err(IoTimedOut)], KEPT);
    assert_eq!(steps, [Step::Stop(StopReason::SuppressedNotIdempotent)]);
}

#[test]
fn a_refused_body_after_the_wait_ends_in_an_error_that_says_why() {
    let p = policy();
    let (parts, ()) = req(Method::GET).into_parts();
    let plan = Plan::new(
        &p,
        &parts.method,
        || crate::classify::host::HostSeen::Nothing,
        None,
        "/v1/x",
        &parts.headers,
        &parts.extensions,
    );
    let target = Target::from_uri(parts.method.clone(), parts.uri.clone());
    let mut attempts = Attempts::start(&p, plan, target, Ok(()));
    let mut headers = HeaderMap::new();
    attempts.next_attempt(&mut headers);
    let err = std::io::Error::from(IoTimedOut);
    assert!(matches!(
        attempts.on_outcome(Outcome::Error(&err), KEPT),
        Step::Wait(_)
    ));
    assert!(attempts.body_wait() <= super::LET_GO_WAIT);
    let err = attempts.finish_refused(NotReplayable::StillInUse);
    assert_eq!(err.attempts(), 1);
    assert_eq!(
        err.report().unwrap().body_not_replayable(),
        Some(NotReplayable::StillInUse)
    );
}
