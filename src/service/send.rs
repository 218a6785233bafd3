//! What the layer's two states that send share: the retry's service and copy, sending an
//! attempt, polling one against its timer, and a body that could not be sent again.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::request::Parts;
use http::{Extensions, HeaderMap, Method, Request, Version};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::kept::Kept;
use super::{AttemptNumber, KeyHeader, LayerAttempt, NotReplayable, ReplayBody};
use crate::attempt_clock::{when_fired, AttemptClock, Fired};
use crate::attempts::Attempts;
use crate::box_error::BoxError;
use crate::policy::StopReason;
use crate::timed_out::TimedOut;

pin_project! {
    /// The timer that cuts an attempt, why it would, and the attempt's clock (a body read
    /// inside the attempt is timed frame by frame).
    pub(super) struct Timer {
        #[pin]
        sleep: Sleep,
        why: TimedOut,
        clock: Option<AttemptClock>,
    }
}

/// The timer that cuts an attempt (`None`: no deadline, no per-attempt timeout). Boxed: only a
/// request with a clock pays for its size.
pub(super) type AttemptTimer = Option<Pin<Box<Timer>>>;

/// What a retry needs: a service of its own and a copy of the request. The copy has no URI:
/// the attempts' target keeps the one copy of it.
pub(super) struct Replay<S, B> {
    pub(super) service: S,
    pub(super) head: Head,
    pub(super) body: Kept<B>,
}

/// A copy of the request's head but its method and URI, which the attempts' target keeps. Not
/// a `Parts` with a default URI: that held an unused `Uri` in every request's future (88 bytes)
/// and made and dropped one per request.
pub(super) struct Head {
    version: Version,
    headers: HeaderMap,
    extensions: Extensions,
}

impl Head {
    pub(super) fn copy_of(parts: &Parts) -> Self {
        Head {
            version: parts.version,
            headers: parts.headers.clone(),
            extensions: parts.extensions.clone(),
        }
    }

    /// The head of the next attempt: `method` to `uri`.
    fn parts(&self, method: Method, uri: http::Uri) -> Parts {
        let (mut parts, ()) = Request::new(()).into_parts();
        parts.method = method;
        parts.uri = uri;
        parts.version = self.version;
        parts.headers = self.headers.clone();
        parts.extensions = self.extensions.clone();
        parts
    }
}

/// Polls the attempt in flight, cut by the policy's clock if it runs out first (the attempt is
/// then dropped with its state: cut, maybe sent).
#[inline(always)]
pub(super) fn poll_attempt<F, R, E>(
    future: Pin<&mut F>,
    timer: &mut AttemptTimer,
    attempts: &Attempts,
    cx: &mut Context<'_>,
) -> Poll<Result<R, BoxError>>
where
    F: Future<Output = Result<R, E>>,
    E: Into<BoxError>,
{
    if let Poll::Ready(result) = future.poll(cx) {
        return Poll::Ready(result.map_err(Into::into));
    }
    loop {
        let Some(running) = timer.as_mut() else {
            return Poll::Pending;
        };
        ready!(running.as_mut().project().sleep.poll(cx));
        if let Some(why) = extend_or_cut(timer, attempts) {
            return Poll::Ready(Err(Box::new(why)));
        }
    }
}

/// The attempt's timer fired: the error that cuts the attempt, or `None` when only the
/// deadline (the timer reset to it) or nothing cuts it any more.
#[cold]
fn extend_or_cut(timer: &mut AttemptTimer, attempts: &Attempts) -> Option<TimedOut> {
    let fired = timer.as_mut()?.as_mut().project();
    match when_fired(*fired.why, fired.clock.as_ref(), attempts.time_left()) {
        Fired::Cut(why) => Some(why),
        Fired::Until(left) => {
            fired.sleep.reset(Instant::now() + left);
            *fired.why = TimedOut::Deadline;
            None
        }
        Fired::Never => {
            *timer = None;
            None
        }
    }
}

/// Sends the next attempt with `body`.
#[inline]
pub(super) fn resend<S, B>(
    replay: &mut Replay<S, B>,
    attempts: &mut Attempts,
    body: B,
) -> (S::Future, AttemptTimer)
where
    S: Service<Request<B>>,
{
    let target = attempts.target();
    let mut parts = replay.head.parts(
        target.method.clone(),
        target
            .uri()
            .expect("the layer's target is made from the request's URI")
            .clone(),
    );
    parts.extensions.insert(LayerAttempt);
    KeyHeader::mark(attempts.policy(), &mut parts.extensions);
    let number = attempts.next_attempt(&mut parts.headers);
    parts.extensions.insert(AttemptNumber(number));
    let timer = attempt_timer(attempts, &mut parts.extensions);
    let _span = attempts.enter_span();
    (replay.service.call(Request::from_parts(parts, body)), timer)
}

/// How a request ends when its next attempt cannot be sent: the outcome and why.
pub(super) type Ended<R> = (Result<R, BoxError>, StopReason);

/// The next attempt, sent: its future and its timer.
pub(super) type Sent<S, B> = (<S as Service<Request<B>>>::Future, AttemptTimer);

/// The next attempt, once the retry's service is ready: sent, or how the request ends
/// instead.
/// `deadline` fires at the request's deadline, if it has one: the wait for the service ends
/// there.
pub(super) fn poll_resend<S, B, R>(
    replay: &mut Replay<S, B>,
    body: &mut Option<B>,
    deadline: &mut Option<Pin<Box<Sleep>>>,
    attempts: &mut Attempts,
    cx: &mut Context<'_>,
) -> Poll<Result<Sent<S, B>, Ended<R>>>
where
    S: Service<Request<B>>,
    S::Error: Into<BoxError>,
    B: ReplayBody,
{
    // The clone may be a handle to a shared resource (a buffer, a pool, a concurrency limit):
    // `call` is only allowed once it says it is ready.
    match replay.service.poll_ready(cx) {
        Poll::Ready(Ok(())) => {}
        Poll::Ready(Err(err)) => {
            return Poll::Ready(Err((Err(err.into()), StopReason::ServiceNotReady)))
        }
        Poll::Pending => {
            ready!(deadline
                .as_mut()
                .map_or(Poll::Pending, |d| d.as_mut().poll(cx)));
            return Poll::Ready(Err(attempts.stop_at_deadline()));
        }
    }
    // The wait for readiness may have outlasted the deadline (a concurrency limit, a buffer):
    // nothing is handed on for a caller who has stopped waiting.
    if attempts.past_deadline() {
        return Poll::Ready(Err(attempts.stop_at_deadline()));
    }
    // A copy is made now (never pending); a recording came with the state.
    Poll::Ready(match body.take().map_or_else(|| replay.body.copy(), Ok) {
        Ok(body) => Ok(resend(replay, attempts, body)),
        Err(why) => Err(refused(attempts, why)),
    })
}

/// A body that could not be sent again after all: the outcome that stops the retries (the
/// last attempt's own outcome was already dropped for the retry).
#[cold]
pub(super) fn refused<R>(attempts: &mut Attempts, why: NotReplayable) -> Ended<R> {
    attempts.refuse_replay(why);
    (Err(why.to_string().into()), StopReason::BodyNotReplayable)
}

/// The timer that cuts the next attempt, if the request has a deadline or a per-attempt
/// timeout; the attempt's clock then goes in its `extensions`.
#[inline]
pub(super) fn attempt_timer(
    attempts: &mut Attempts,
    extensions: &mut http::Extensions,
) -> AttemptTimer {
    let (limit, why) = attempts.sent_attempt_limit()?;
    let clock = attempts.clock();
    extensions.insert(clock.clone());
    Some(Box::pin(Timer {
        sleep: tokio::time::sleep(limit),
        why,
        clock: Some(clock),
    }))
}
