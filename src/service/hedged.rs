//! The layer's hedging state: several attempts of one request in flight, a timer for the next
//! hedge, a backoff when none is left running. Every decision is the core's
//! ([`Attempts::on_hedged_outcome`], [`Attempts::may_hedge`]); this only sends, polls and
//! drops.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tokio::time::Sleep;
use tower_service::Service;
use tracing::Span;

use super::send::{poll_attempt, refused, resend, AttemptTimer, Replay};
use super::ReplayBody;
use crate::attempts::{superseded, Attempts, HedgeStep, Outcome};
use crate::box_error::BoxError;
use crate::policy::StopReason;

/// The attempts of a hedged request.
pub(super) struct Hedged<F> {
    in_flight: Vec<InFlight<F>>,
    /// Fires the next hedge, while hedges are left.
    timer: Option<Pin<Box<Sleep>>>,
    delay: Duration,
    /// The wait before a retry, when no attempt is left running; once it has passed, the
    /// request's deadline (if it has one) while the retry waits for the service.
    backoff: Option<Pin<Box<Sleep>>>,
    /// The attempt to send as soon as the service is ready: counted, and its budget spent,
    /// only then.
    send: Option<Send>,
}

/// Why the next attempt is sent.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Send {
    /// A hedge: the attempts in flight are slow.
    Hedge,
    /// A resend while others are in flight: one of them failed.
    Resend,
    /// The retry after a backoff, nothing in flight (its budget was spent when decided).
    Retry,
}

struct InFlight<F> {
    /// Numbered from 1 in the order sent.
    number: u32,
    future: Pin<Box<F>>,
    timer: AttemptTimer,
    span: Span,
}

impl<F> Hedged<F> {
    /// The first attempt is in flight; the first hedge may go after `delay`.
    pub(super) fn new(future: F, timer: AttemptTimer, delay: Duration, span: Span) -> Self {
        Hedged {
            in_flight: vec![InFlight {
                number: 1,
                future: Box::pin(future),
                timer,
                span,
            }],
            timer: Some(Box::pin(tokio::time::sleep(delay))),
            delay,
            backoff: None,
            send: None,
        }
    }
}

/// The request's outcome and why no further attempt was sent.
type Ended<ResBody> = (Result<Response<ResBody>, BoxError>, StopReason);

/// Polls every attempt in flight, sends hedges and retries; ready with the request's outcome.
/// The attempts still running then are dropped here: on HTTP/2 that resets their streams, on
/// HTTP/1 it closes their connections.
pub(super) fn poll<S, B, ResBody>(
    h: &mut Hedged<S::Future>,
    replay: &mut Replay<S, B>,
    attempts: &mut Attempts,
    cx: &mut Context<'_>,
) -> Poll<Ended<ResBody>>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    B: ReplayBody,
{
    loop {
        if let Some(ended) = poll_in_flight(h, attempts, cx) {
            return Poll::Ready(ended);
        }
        poll_timers(h, attempts, cx);
        let Some(send) = h.send else {
            return Poll::Pending;
        };
        if let Some(polled) = send_next(h, replay, attempts, cx, send) {
            return polled;
        }
    }
}

/// Polls each attempt in flight and hands each outcome to the core; the request's outcome
/// when the core stops (the others are dropped, superseded).
fn poll_in_flight<F, ResBody, E>(
    h: &mut Hedged<F>,
    attempts: &mut Attempts,
    cx: &mut Context<'_>,
) -> Option<Ended<ResBody>>
where
    F: Future<Output = Result<Response<ResBody>, E>>,
    E: Into<BoxError>,
{
    let mut i = 0;
    while i < h.in_flight.len() {
        let a = &mut h.in_flight[i];
        let entered = a.span.enter();
        let Poll::Ready(result) = poll_attempt(a.future.as_mut(), &mut a.timer, attempts, cx)
        else {
            drop(entered);
            i += 1;
            continue;
        };
        drop(entered);
        let done = h.in_flight.swap_remove(i);
        attempts.use_span(done.span);
        let others = !h.in_flight.is_empty();
        match attempts.on_hedged_outcome(done.number, Outcome::of(&result), others) {
            HedgeStep::Stop(reason) => {
                attempts.supersede(h.in_flight.iter().map(|a| a.number));
                h.in_flight.iter().for_each(|a| superseded(&a.span));
                h.in_flight.clear();
                return Some((result, reason));
            }
            HedgeStep::KeepWaiting { resend_now: true } => h.send = Some(Send::Resend),
            HedgeStep::KeepWaiting { resend_now: false } => {}
            HedgeStep::Wait(after) => {
                h.timer = None;
                h.backoff = Some(Box::pin(tokio::time::sleep(after)));
                // A hedge or resend not yet sent (the service was not ready) does not go
                // as well as the retry.
                h.send = None;
            }
        }
    }
    None
}

/// The hedge timer and the backoff: each that fired says what to send next.
fn poll_timers<F>(h: &mut Hedged<F>, attempts: &Attempts, cx: &mut Context<'_>) {
    if let Some(timer) = &mut h.timer {
        if timer.as_mut().poll(cx).is_ready() {
            h.timer = None;
            if h.send.is_none() && !h.in_flight.is_empty() && attempts.hedges_left() {
                h.send = Some(Send::Hedge);
            }
        }
    }
    if h.send != Some(Send::Retry) {
        if let Some(backoff) = &mut h.backoff {
            if backoff.as_mut().poll(cx).is_ready() {
                h.send = Some(Send::Retry);
                // From now on the same timer waits for the deadline, if any.
                match attempts.deadline_at() {
                    Some(at) => backoff.as_mut().reset(at),
                    None => h.backoff = None,
                }
            }
        }
    }
}

/// Sends the attempt `send` once the service is ready and the core still allows it; `None`
/// to poll again (sent, or not allowed with others in flight), else what `poll` returns.
fn send_next<S, B, ResBody>(
    h: &mut Hedged<S::Future>,
    replay: &mut Replay<S, B>,
    attempts: &mut Attempts,
    cx: &mut Context<'_>,
    send: Send,
) -> Option<Poll<Ended<ResBody>>>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    B: ReplayBody,
{
    // The clone may be a handle to a shared resource: `call` only once it is ready.
    let ready = match replay.service.poll_ready(cx) {
        Poll::Pending if send == Send::Retry => {
            // Nothing in flight: the request ends at its deadline if the service is still
            // not ready then.
            let deadline = h.backoff.as_mut().map(|d| d.as_mut().poll(cx));
            return Some(match deadline {
                Some(Poll::Ready(())) => Poll::Ready(attempts.stop_at_deadline()),
                _ => Poll::Pending,
            });
        }
        Poll::Pending => return Some(Poll::Pending),
        Poll::Ready(ready) => ready,
    };
    h.send = None;
    if send == Send::Retry {
        h.backoff = None;
    }
    if let Err(err) = ready {
        if h.in_flight.is_empty() {
            return Some(Poll::Ready((Err(err.into()), StopReason::ServiceNotReady)));
        }
        // The attempts in flight may still answer; nothing more is sent.
        return Some(Poll::Pending);
    }
    let body = match replay.body.copy() {
        Ok(body) => body,
        Err(why) if h.in_flight.is_empty() => return Some(Poll::Ready(refused(attempts, why))),
        Err(_) => return Some(Poll::Pending),
    };
    // Spent and counted now that the attempt is handed on, not when it was wanted: the
    // service may have stayed busy until another attempt ended the request.
    let go = match send {
        Send::Hedge => attempts.may_hedge(),
        Send::Resend => attempts.may_resend_now(),
        Send::Retry => !attempts.past_deadline(),
    };
    if !go {
        return h
            .in_flight
            .is_empty()
            .then(|| Poll::Ready(attempts.stop_at_deadline()));
    }
    let (future, timer) = resend(replay, attempts, body);
    h.in_flight.push(InFlight {
        number: attempts.sent(),
        future: Box::pin(future),
        timer,
        span: attempts.span().clone(),
    });
    if attempts.hedges_left() {
        h.timer = Some(Box::pin(tokio::time::sleep(h.delay)));
    }
    None
}
