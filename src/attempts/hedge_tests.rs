//! Hedging's steps in `Attempts`, driven alone (no runtime, no transport): which requests get a
//! hedge delay, when the next hedge may go, and what an outcome means while others run.

use std::time::Duration;

use http::{Extensions, HeaderMap, HeaderValue, Request, StatusCode};

use super::{Attempts, HedgeStep, Outcome, Plan};
use crate::hedge::Hedge;
use crate::policy::RetryPolicy;
use crate::policy::StopReason;
use crate::target::Target;

fn policy(hedge: Hedge) -> RetryPolicy {
    RetryPolicy::builder()
        .honor_idempotency_key(true)
        .hedge(hedge)
        .no_budget()
        .build()
        .unwrap()
}

/// `Attempts` for `req`, its hedge delay (`copyable`: the front end kept a copy), and the
/// first attempt sent.
fn start(policy: &RetryPolicy, req: Request<()>, copyable: bool) -> (Attempts, Option<Duration>) {
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
    let delay = attempts.plan_hedge(|| Some(("api.example", None)), copyable);
    attempts.next_attempt(&mut HeaderMap::new());
    (attempts, delay)
}

fn get() -> Request<()> {
    Request::get("http://api.example/items").body(()).unwrap()
}

fn status(a: &mut Attempts, n: u32, code: u16, headers: &HeaderMap, others: bool) -> HedgeStep {
    let outcome = Outcome::Response {
        status: StatusCode::from_u16(code).unwrap(),
        headers,
        extensions: &Extensions::new(),
    };
    a.on_hedged_outcome(n, outcome, others)
}

#[test]
fn only_a_copyable_request_a_repeat_cannot_harm_gets_a_delay() {
    let fixed = Hedge::fixed(Duration::from_millis(7)).max_extra_load(1.0);
    let p = policy(fixed.clone());
    assert_eq!(start(&p, get(), true).1, Some(Duration::from_millis(7)));
    assert_eq!(start(&p, get(), false).1, None, "a recording is not hedged");
    let post = Request::post("http://api.example/pay").body(()).unwrap();
    assert_eq!(start(&p, post, true).1, None, "a write without a key");
    let keyed = || {
        Request::post("http://api.example/pay")
            .header("idempotency-key", "\"k\"")
            .body(())
            .unwrap()
    };
    assert_eq!(
        start(&p, keyed(), true).1,
        None,
        "a keyed write without the opt-in"
    );
    let opted = policy(fixed.keyed_writes(true));
    assert_eq!(
        start(&opted, keyed(), true).1,
        Some(Duration::from_millis(7))
    );
    let none = RetryPolicy::builder()
        .hedge(Hedge::fixed(Duration::from_millis(7)))
        .max_retries(0)
        .build()
        .unwrap();
    assert_eq!(start(&none, get(), true).1, None, "max_retries 0");
    let unhedged = RetryPolicy::builder().build().unwrap();
    assert_eq!(start(&unhedged, get(), true).1, None, "no hedging");
}

#[test]
fn hedges_stop_at_max_hedges_and_at_the_hedge_budget() {
    let p = policy(
        Hedge::fixed(Duration::from_millis(5))
            .max_extra_load(1.0)
            .max_hedges(2),
    );
    // One token saved by this request; the second hedge finds none.
    let (mut a, _) = start(&p, get(), true);
    assert!(a.may_hedge());
    a.next_attempt(&mut HeaderMap::new());
    assert!(a.hedges_left());
    assert!(!a.may_hedge(), "no token left");
    // More requests saved more: two hedges, then max_hedges.
    for _ in 0..3 {
        start(&p, get(), true);
    }
    let (mut a, _) = start(&p, get(), true);
    for _ in 0..2 {
        assert!(a.may_hedge());
        a.next_attempt(&mut HeaderMap::new());
    }
    assert!(!a.hedges_left());
    assert!(!a.may_hedge());
    assert_eq!(a.sent(), 3);
}

#[test]
fn outcomes_while_others_run() {
    let p = policy(
        Hedge::fixed(Duration::from_millis(5))
            .max_extra_load(1.0)
            .keyed_writes(true),
    );
    let none = HeaderMap::new();
    // A retryable status: wait for the others, and send the next at once.
    let (mut a, _) = start(&p, get(), true);
    assert!(a.may_hedge());
    a.next_attempt(&mut HeaderMap::new());
    assert_eq!(
        status(&mut a, 2, 503, &none, true),
        HedgeStep::KeepWaiting { resend_now: true }
    );
    assert_eq!(a.next_attempt(&mut HeaderMap::new()), 3);
    // The server asked for a wait: nothing at once.
    let mut wait = HeaderMap::new();
    wait.insert("retry-after", HeaderValue::from_static("3"));
    assert_eq!(
        status(&mut a, 1, 429, &wait, true),
        HedgeStep::KeepWaiting { resend_now: false }
    );
    // A success wins and ends all; the report says which.
    assert_eq!(
        status(&mut a, 3, 200, &none, false),
        HedgeStep::Stop(StopReason::Final)
    );
    a.supersede(std::iter::empty());
    let report = a.take_report(StopReason::Final);
    assert_eq!(
        (report.hedges(), report.won_by(), report.attempts()),
        (1, Some(3), 3)
    );

    // A keyed write's 409 from the hedge: keep waiting for the first, nothing more sent.
    let keyed = Request::post("http://api.example/pay")
        .header("idempotency-key", "\"k\"")
        .body(())
        .unwrap();
    let (mut a, _) = start(&p, keyed, true);
    assert!(a.may_hedge());
    a.next_attempt(&mut HeaderMap::new());
    assert_eq!(
        status(&mut a, 2, 409, &none, true),
        HedgeStep::KeepWaiting { resend_now: false }
    );
    assert_eq!(
        status(&mut a, 1, 201, &none, false),
        HedgeStep::Stop(StopReason::Final)
    );
    assert_eq!(a.take_report(StopReason::Final).won_by(), Some(1));

    // A final status ends all, whichever attempt gave it; superseded ones are counted.
    let (mut a, _) = start(&p, get(), true);
    assert!(a.may_hedge());
    a.next_attempt(&mut HeaderMap::new());
    assert_eq!(
        status(&mut a, 2, 404, &none, true),
        HedgeStep::Stop(StopReason::Final)
    );
    a.supersede([1].into_iter());
    let report = a.take_report(StopReason::Final);
    assert_eq!(
        (report.won_by(), report.superseded(), report.attempts()),
        (Some(2), 1, 2)
    );
    // The superseded attempt may have reached the server; a GET applies nothing there.
    assert!(report.reached_the_server());
    assert!(!report.may_have_been_applied());
}

/// The learned delay counts responses, attempts cut by a timeout and superseded attempts (as
/// lower bounds), not fast failures (errors but timeouts, 5xx, 429).
#[test]
fn what_the_learned_delay_counts() {
    let p = policy(Hedge::learned().max_extra_load(1.0));
    let h = p.hedging().unwrap();
    let slot = h.slot(|| Some(("api.example", None)));
    let counted = || h.samples(slot);
    let none = HeaderMap::new();
    let (mut a, _) = start(&p, get(), true);
    let step = status(&mut a, 1, 503, &none, false);
    assert!(matches!(step, HedgeStep::Wait(_)), "{step:?}");
    assert_eq!(counted(), 0, "a 503 is a fast failure");

    let (mut a, _) = start(&p, get(), true);
    let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    a.on_hedged_outcome(1, Outcome::Error(&refused), false);
    assert_eq!(counted(), 0, "a refused connection is a fast failure");

    let (mut a, _) = start(&p, get(), true);
    let cut = crate::timed_out::TimedOut::Attempt;
    a.on_hedged_outcome(1, Outcome::Error(&cut), false);
    assert_eq!(counted(), 1, "an attempt cut by the timeout");

    let (mut a, _) = start(&p, get(), true);
    assert!(a.may_hedge());
    a.next_attempt(&mut HeaderMap::new());
    assert_eq!(
        status(&mut a, 2, 200, &none, true),
        HedgeStep::Stop(StopReason::Final)
    );
    assert_eq!(counted(), 2, "the winner");
    a.supersede([1].into_iter());
    assert_eq!(counted(), 3, "the superseded first attempt");
}
