//! The adapter's hedged loop: several attempts of one request in flight, each through its own
//! clone of the chain's `Next` with its own copy of the extensions. Every decision is the
//! core's ([`Attempts::on_hedged_outcome`], [`Attempts::may_hedge`]); this only sends, polls
//! and drops.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use http::Extensions;
use reqwest::{Request, Response};
use reqwest_middleware::Next;
use tokio::time::Sleep;
use tracing::{Instrument, Span};

use super::{into_box, outcome};
use crate::attempts::{superseded, Attempts, HedgeStep};
use crate::service::{AttemptNumber, NotReplayable};
use crate::timed_out::TimedOut;

type Output = (reqwest_middleware::Result<Response>, Extensions);
type Attempt<'a> = Pin<Box<dyn Future<Output = Output> + Send + 'a>>;

/// What woke the loop.
enum Event {
    Done(u32, Output, Span),
    Hedge,
    Backoff,
}

/// Sends `first` (attempt 1) and hedges it after `delay` while the core allows, each hedge a
/// copy of `copy`. The attempts still running when one's outcome is returned are dropped:
/// on HTTP/2 that resets their streams, on HTTP/1 it closes their connections. The winner's
/// extensions become the caller's.
pub(super) async fn run(
    attempts: &mut Attempts,
    next: Next<'_>,
    first: Request,
    extensions: &mut Extensions,
    copy: &Request,
    delay: Duration,
) -> reqwest_middleware::Result<Response> {
    let limit = attempts.sent_attempt_limit();
    let span = attempts.span().clone();
    let first = launch(next.clone(), first, extensions.clone(), limit, span.clone());
    let mut in_flight = vec![(1, first, span)];
    let mut timer: Option<Pin<Box<Sleep>>> = Some(Box::pin(tokio::time::sleep(delay)));
    let mut backoff: Option<Pin<Box<Sleep>>> = None;
    loop {
        let event =
            std::future::poll_fn(|cx| poll_event(cx, &mut in_flight, &mut timer, &mut backoff))
                .await;
        let send = match event {
            Event::Done(number, (result, ext), span) => {
                attempts.use_span(span);
                if let (true, Ok(res)) = (attempts.sends_deadline(), &result) {
                    super::redirect::warn_if_followed(copy.url(), res);
                }
                let others = !in_flight.is_empty();
                match attempts.on_hedged_outcome(number, outcome(&result), others) {
                    HedgeStep::Stop(reason) => {
                        attempts.supersede(in_flight.iter().map(|(n, ..)| *n));
                        in_flight.iter().for_each(|(.., span)| superseded(span));
                        drop(in_flight);
                        *extensions = ext;
                        return attempts
                            .finish(result.map_err(into_box), reason)
                            .map_err(reqwest_middleware::Error::middleware);
                    }
                    HedgeStep::KeepWaiting { resend_now } => {
                        resend_now && attempts.may_resend_now()
                    }
                    HedgeStep::Wait(after) => {
                        timer = None;
                        backoff = Some(Box::pin(tokio::time::sleep(after)));
                        false
                    }
                }
            }
            Event::Hedge => !in_flight.is_empty() && attempts.may_hedge(),
            Event::Backoff => true,
        };
        if !send {
            continue;
        }
        let Some(mut req) = copy.try_clone() else {
            if in_flight.is_empty() {
                let err = attempts.finish_refused(NotReplayable::Stream);
                return Err(reqwest_middleware::Error::middleware(err));
            }
            continue;
        };
        let number = attempts.next_attempt(req.headers_mut());
        if let Some(timeout) = req.timeout().copied() {
            attempts.cap_wire_wait(req.headers_mut(), timeout);
        }
        let limit = attempts.sent_attempt_limit();
        let mut ext = extensions.clone();
        ext.insert(AttemptNumber(number));
        let span = attempts.span().clone();
        let attempt = launch(next.clone(), req, ext, limit, span.clone());
        in_flight.push((number, attempt, span));
        if attempts.hedges_left() {
            timer = Some(Box::pin(tokio::time::sleep(delay)));
        }
    }
}

/// The first of: an attempt's outcome (taken out of `in_flight`), the hedge timer, the
/// backoff (each timer cleared once it fired).
fn poll_event(
    cx: &mut std::task::Context<'_>,
    in_flight: &mut Vec<(u32, Attempt<'_>, Span)>,
    timer: &mut Option<Pin<Box<Sleep>>>,
    backoff: &mut Option<Pin<Box<Sleep>>>,
) -> Poll<Event> {
    for i in 0..in_flight.len() {
        if let Poll::Ready(out) = in_flight[i].1.as_mut().poll(cx) {
            let (number, _, span) = in_flight.swap_remove(i);
            return Poll::Ready(Event::Done(number, out, span));
        }
    }
    if let Some(t) = timer {
        if t.as_mut().poll(cx).is_ready() {
            *timer = None;
            return Poll::Ready(Event::Hedge);
        }
    }
    if let Some(b) = backoff {
        if b.as_mut().poll(cx).is_ready() {
            *backoff = None;
            return Poll::Ready(Event::Backoff);
        }
    }
    Poll::Pending
}

/// One attempt through the rest of the chain, cut by the policy's clock if it runs out first.
fn launch<'a>(
    next: Next<'a>,
    req: Request,
    mut ext: Extensions,
    limit: Option<(Duration, TimedOut)>,
    span: Span,
) -> Attempt<'a> {
    let attempt = async move {
        let attempt = next.run(req, &mut ext);
        let result = match limit {
            None => attempt.await,
            // Cut by the policy's clock: the attempt may have been sent.
            Some((limit, why)) => tokio::time::timeout(limit, attempt)
                .await
                .unwrap_or_else(|_| Err(reqwest_middleware::Error::middleware(why))),
        };
        (result, ext)
    };
    Box::pin(attempt.instrument(span))
}
