//! The report's "may this have been applied?" answer, cell by cell of the decision table.

use super::RetryReport;
use super::*;
use crate::classify::Idempotency;

/// What an attempt ended in, for the report's cells.
#[derive(Clone, Copy)]
enum Outcome {
    /// An error of this kind (`ConnectionRefused`: not sent; `TimedOut`: ambiguous).
    Err(std::io::ErrorKind),
    /// A response with this status and, if set, the stored-response header.
    Res(u16, bool),
}
use self::Outcome::{Err as E, Res};
use std::io::ErrorKind::{ConnectionRefused, InvalidInput, TimedOut};

/// Drives the decision core through `outcomes` (one per attempt, until it stops) and
/// returns the report, and whether the error (if it ended in one) is ambiguous.
fn drive(
    policy: RetryPolicy,
    req: http::Request<()>,
    outcomes: &[Outcome],
) -> (RetryReport, Option<bool>) {
    let (parts, ()) = req.into_parts();
    let plan = Plan::new(
        &policy,
        &parts.method,
        || match parts.uri.host() {
            Some(h) => crate::classify::host::HostSeen::Uri(h, None),
            None => crate::classify::host::HostSeen::Nothing,
        },
        None,
        parts.uri.path(),
        &parts.headers,
        &parts.extensions,
    );
    let target = Target::from_uri(parts.method.clone(), parts.uri.clone());
    let mut attempts = Attempts::start(&policy, plan, target, Ok(()));
    for (i, outcome) in outcomes.iter().enumerate() {
        let decision = match outcome {
            E(kind) => attempts.on_error(&std::io::Error::from(*kind)),
            Res(status, stored) => {
                let mut headers = HeaderMap::new();
                if *stored {
                    headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
                }
                let status = StatusCode::from_u16(*status).unwrap();
                attempts.on_response(status, &headers, &Extensions::new())
            }
        };
        let Decision::Stop(stop) = decision else {
            assert!(i + 1 < outcomes.len(), "retried past the last outcome");
            continue;
        };
        assert_eq!(i + 1, outcomes.len(), "stopped before the last outcome");
        return match outcome {
            E(kind) => {
                let err = attempts.take_error(stop, Box::new(std::io::Error::from(*kind)));
                let ambiguous = err.is_ambiguous();
                let report = err.report().unwrap();
                assert_eq!(
                    err.may_have_been_applied(),
                    report.may_have_been_applied(),
                    "the error and its report agree"
                );
                assert_eq!(
                    ambiguous,
                    report.reached_the_server(),
                    "the error is ambiguous when an attempt may have reached the server"
                );
                assert_eq!(
                    crate::attempts::MayHaveBeenApplied::may_have_been_applied(&err),
                    err.may_have_been_applied()
                );
                (report.clone(), Some(ambiguous))
            }
            Res(..) => (attempts.take_report(stop), None),
        };
    }
    unreachable!("no outcomes")
}

fn policy(b: crate::policy::builder::RetryPolicyBuilder) -> RetryPolicy {
    b.jitter(false).no_budget().max_retries(3).build().unwrap()
}

fn keyed_post() -> http::Request<()> {
    http::Request::post("http://api.test/v1/messages")
        .header("idempotency-key", "\"k-1\"")
        .body(())
        .unwrap()
}

// --- "may this write have been applied?", cell by cell ---

#[test]
fn applied_suppressed_after_an_ambiguous_error() {
    let post = http::Request::post("http://api.test/v1/messages")
        .body(())
        .unwrap();
    let (report, err) = drive(policy(RetryPolicy::builder()), post, &[E(TimedOut)]);
    assert_eq!(report.stop_reason(), StopReason::SuppressedNotIdempotent);
    assert!(report.may_have_been_applied());
    assert_eq!(err, Some(true));
}

#[test]
fn applied_suppressed_on_a_retryable_response() {
    let post = http::Request::post("http://api.test/v1/messages")
        .body(())
        .unwrap();
    let (report, _) = drive(policy(RetryPolicy::builder()), post, &[Res(503, false)]);
    assert_eq!(report.stop_reason(), StopReason::SuppressedNotIdempotent);
    assert!(report.may_have_been_applied());
}

/// The case: a keyed write timed out, then met 409 "still in flight" until no
/// retries were left. The report says retries were exhausted, not suppressed, and the
/// write may have happened.
#[test]
fn applied_exhausted_on_409_after_a_timeout() {
    let p = policy(RetryPolicy::builder().honor_idempotency_key(true));
    let outcomes = [
        E(TimedOut),
        Res(409, false),
        Res(409, false),
        Res(409, false),
    ];
    let (report, _) = drive(p, keyed_post(), &outcomes);
    assert_eq!(report.stop_reason(), StopReason::RetriesExhausted);
    assert!(!report.retry_suppressed());
    assert!(report.may_have_been_applied());
}

#[test]
fn applied_on_a_stored_response_and_exhausted_on_one_when_the_header_is_ignored() {
    let p = policy(RetryPolicy::builder().honor_idempotency_key(true));
    let (report, _) = drive(p, keyed_post(), &[Res(503, false), Res(503, true)]);
    assert_eq!(report.stop_reason(), StopReason::StoredResponse);
    assert!(report.is_stored_response());
    assert!(report.may_have_been_applied());
    // A policy that ignores the header retries the stored response until none are left.
    let p = policy(
        RetryPolicy::builder()
            .honor_idempotency_key(true)
            .stored_response_header(None),
    );
    let stored_responses = [
        Res(503, false),
        Res(503, true),
        Res(503, true),
        Res(503, true),
    ];
    let (report, _) = drive(p, keyed_post(), &stored_responses);
    assert_eq!(report.stop_reason(), StopReason::RetriesExhausted);
    assert!(report.may_have_been_applied());
}

#[test]
fn applied_a_final_response_after_an_ambiguous_attempt() {
    // An idempotent write: retried after the timeout, then a final 404. (This case was a
    // GET until reads stopped being "maybe applied": see `a_read_is_never_applied`.)
    let put = http::Request::put("http://api.test/v1/things/1")
        .body(())
        .unwrap();
    let (report, _) = drive(
        policy(RetryPolicy::builder()),
        put,
        &[E(TimedOut), Res(404, false)],
    );
    assert_eq!(report.stop_reason(), StopReason::Final);
    assert!(report.may_have_been_applied());
    // A keyed write: the timeout, then a 422 (the key reused with another payload).
    let p = policy(RetryPolicy::builder().honor_idempotency_key(true));
    let (report, _) = drive(p, keyed_post(), &[E(TimedOut), Res(422, false)]);
    assert!(report.may_have_been_applied());
    // Then an error that was not sent: the error is still ambiguous.
    let p = policy(RetryPolicy::builder().honor_idempotency_key(true));
    let outcomes = [
        E(TimedOut),
        E(ConnectionRefused),
        E(ConnectionRefused),
        E(ConnectionRefused),
    ];
    let (report, err) = drive(p, keyed_post(), &outcomes);
    assert_eq!(report.stop_reason(), StopReason::RetriesExhausted);
    assert_eq!(err, Some(true));
}

#[test]
fn applied_a_success() {
    let post = http::Request::post("http://api.test/v1/messages")
        .body(())
        .unwrap();
    let (report, _) = drive(policy(RetryPolicy::builder()), post, &[Res(201, false)]);
    assert_eq!(report.stop_reason(), StopReason::Final);
    assert!(report.may_have_been_applied());
}

#[test]
fn not_applied_when_no_attempt_reached_the_application() {
    let post = || {
        http::Request::post("http://api.test/v1/messages")
            .body(())
            .unwrap()
    };
    // Never sent: refused every time.
    let refused = [
        E(ConnectionRefused),
        E(ConnectionRefused),
        E(ConnectionRefused),
        E(ConnectionRefused),
    ];
    let (report, err) = drive(policy(RetryPolicy::builder()), post(), &refused);
    assert_eq!(report.stop_reason(), StopReason::RetriesExhausted);
    assert!(!report.may_have_been_applied());
    assert_eq!(err, Some(false));
    // A status the API answers only before applying anything, then refused connections.
    let p = policy(RetryPolicy::builder().not_applied_statuses([StatusCode::TOO_MANY_REQUESTS]));
    let outcomes = [
        Res(429, false),
        E(ConnectionRefused),
        E(ConnectionRefused),
        Res(429, false),
    ];
    let (report, _) = drive(p, post(), &outcomes);
    assert!(!report.may_have_been_applied(), "{report:?}");
    // An error the client made before sending (final): not applied.
    let (report, err) = drive(policy(RetryPolicy::builder()), post(), &[E(InvalidInput)]);
    assert_eq!(err, Some(report.may_have_been_applied()));
}

// --- a key that is not trusted is visible ---

#[test]
fn an_untrusted_key_is_named_in_the_report_and_the_error() {
    // Minting with no host named trusts keys unscoped, which yields to a marker that
    // calls the request a write: the README's marker example.
    let p = policy(RetryPolicy::builder().mint_idempotency_keys(true));
    let mut req = http::Request::post("http://api.test/v1/tools/execute")
        .body(())
        .unwrap();
    req.extensions_mut().insert(Idempotency::NonIdempotent);
    let (parts, ()) = req.into_parts();
    let mut headers = parts.headers.clone();
    let mut plan = Plan::new(
        &p,
        &parts.method,
        || crate::classify::host::HostSeen::Nothing,
        None,
        parts.uri.path(),
        &headers,
        &parts.extensions,
    );
    plan.mint_key(&p, &mut headers);
    let target = Target::from_uri(parts.method.clone(), parts.uri.clone());
    let mut attempts = Attempts::start(&p, plan, target, Ok(()));
    let stop = match attempts.on_error(&std::io::Error::from(TimedOut)) {
        Decision::Stop(stop) => stop,
        d => panic!("{d:?}"),
    };
    let err = attempts.take_error(stop, Box::new(std::io::Error::from(TimedOut)));
    assert!(err.idempotency_key().is_some(), "a key was minted");
    assert!(err.idempotency_key_untrusted());
    assert!(
        err.to_string().contains("not trusted for this target"),
        "{err}"
    );
    assert!(
        err.to_string().contains("honor_idempotency_key_for_host"),
        "{err}"
    );
    let report = err.report().unwrap();
    assert!(report.idempotency_key_untrusted());
    assert!(
        report.to_string().contains("not trusted for this target"),
        "{report}"
    );

    // Trusted (a plain POST, no marker): the key is not called untrusted.
    let p = policy(RetryPolicy::builder().honor_idempotency_key(true));
    let (report, _) = drive(p, keyed_post(), &[E(TimedOut), Res(200, false)]);
    assert!(!report.idempotency_key_untrusted());
    assert!(!report.to_string().contains("not trusted"), "{report}");
}

// --- a read applies nothing; a write may have, whatever cell ends it ---

/// "May have been applied" is true only of what can be applied: a GET that timed out is
/// ambiguous (the failure) but applied nothing (the request). Every method against every
/// failure class, with the expected answer written out per cell. From the new user's report
/// that an SDK passing the answer on told its users a read "may have been applied".
#[test]
fn a_read_is_never_applied() {
    use http::Method;
    // (outcomes, whether some attempt reached the server, what the error says if it ended in one)
    let cells: [(&str, &[Outcome], bool, Option<bool>); 5] = [
        ("not sent", &[E(ConnectionRefused); 4], false, Some(false)),
        ("ambiguous", &[E(TimedOut); 4], true, Some(true)),
        (
            "retryable",
            &[
                Res(503, false),
                Res(503, false),
                Res(503, false),
                Res(503, false),
            ],
            true,
            None,
        ),
        ("final", &[Res(404, false)], true, None),
        ("success", &[Res(200, false)], true, None),
    ];
    let reads = [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE];
    let writes = [Method::PUT, Method::DELETE, Method::POST, Method::PATCH];
    for (name, outcomes, reached, ambiguous) in cells {
        for method in reads.iter().chain(&writes) {
            let read = reads.contains(method);
            let req = http::Request::builder()
                .method(method.clone())
                .uri("http://api.test/v1/things/1")
                .body(())
                .unwrap();
            // A write that is not idempotent stops at the first ambiguous or retryable cell.
            let idempotent = Idempotency::of_method(method) == Idempotency::Idempotent;
            let outcomes = if idempotent || !reached {
                outcomes
            } else {
                &outcomes[..1]
            };
            let (report, err) = drive(policy(RetryPolicy::builder()), req, outcomes);
            assert_eq!(report.verdict().can_apply(), !read, "{method}");
            assert_eq!(report.reached_the_server(), reached, "{name} {method}");
            assert_eq!(
                report.may_have_been_applied(),
                reached && !read,
                "{name} {method}: {report}"
            );
            assert_eq!(
                err, ambiguous,
                "{name} {method}: the error describes the failure"
            );
            let text = report.to_string();
            assert_eq!(text.contains("applied"), !read, "{name} {method}: {text}");
        }
    }
}

/// A rule or marker that calls a safe method a write makes it one: it may have been applied.
/// `NoRetry` calls nothing a write: a GET with it stays a read.
#[test]
fn a_read_called_a_write_by_a_rule_or_marker_may_have_been_applied() {
    let get = || {
        http::Request::get("http://api.test/v1/reports/run")
            .body(())
            .unwrap()
    };
    let by_route = policy(RetryPolicy::builder().route(
        http::Method::GET,
        "/v1/reports/run",
        Idempotency::NonIdempotent,
    ));
    let (report, err) = drive(by_route, get(), &[E(TimedOut)]);
    assert_eq!(report.stop_reason(), StopReason::SuppressedNotIdempotent);
    assert!(report.may_have_been_applied());
    assert_eq!(err, Some(true));

    let mut marked = get();
    marked.extensions_mut().insert(Idempotency::NonIdempotent);
    let (report, _) = drive(policy(RetryPolicy::builder()), marked, &[E(TimedOut)]);
    assert!(report.may_have_been_applied());

    let mut once = get();
    once.extensions_mut().insert(crate::classify::NoRetry);
    let (report, err) = drive(policy(RetryPolicy::builder()), once, &[E(TimedOut)]);
    assert_eq!(report.stop_reason(), StopReason::NoRetryMarker);
    assert!(!report.may_have_been_applied());
    assert_eq!(err, Some(true), "still ambiguous: the failure is unknown");

    // A GET marked idempotent stays a read; a POST marked idempotent stays a write.
    let mut idem = get();
    idem.extensions_mut().insert(Idempotency::Idempotent);
    let (report, _) = drive(
        policy(RetryPolicy::builder()),
        idem,
        &[E(TimedOut), Res(200, false)],
    );
    assert!(!report.may_have_been_applied());
    let mut post = http::Request::post("http://api.test/v1/search")
        .body(())
        .unwrap();
    post.extensions_mut().insert(Idempotency::Idempotent);
    let (report, _) = drive(
        policy(RetryPolicy::builder()),
        post,
        &[E(TimedOut), Res(200, false)],
    );
    assert!(report.may_have_been_applied());
}
