//! What the layer's two states that send share: the retry's service and copy, sending an
//! attempt, polling one against its timer, and a body that could not be sent again.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::request::Parts;
use http::Request;
use tokio::time::Sleep;
use tower_service::Service;

use super::replay::Kept;
use super::{AttemptNumber, LayerAttempt, NotReplayable};
use crate::attempts::Attempts;
use crate::policy::StopReason;
use crate::timed_out::TimedOut;
use crate::BoxError;

/// The timer that cuts an attempt, and why it would (`None`: no deadline, no per-attempt
/// timeout).
pub(super) type AttemptTimer = Option<(Pin<Box<Sleep>>, TimedOut)>;

/// What a retry needs: a service of its own and a copy of the request. The copy has no URI:
/// the attempts' target keeps the one copy of it.
pub(super) struct Replay<S, B> {
    pub(super) service: S,
    pub(super) parts: Parts,
    pub(super) body: Kept<B>,
}

/// Polls the attempt in flight, cut by the policy's clock if it runs out first (the attempt is
/// then dropped with its state: cut, maybe sent).
#[inline(always)]
pub(super) fn poll_attempt<F, R, E>(
    future: Pin<&mut F>,
    timer: &mut AttemptTimer,
    cx: &mut Context<'_>,
) -> Poll<Result<R, BoxError>>
where
    F: Future<Output = Result<R, E>>,
    E: Into<BoxError>,
{
    if let Poll::Ready(result) = future.poll(cx) {
        return Poll::Ready(result.map_err(Into::into));
    }
    let Some((sleep, why)) = timer else {
        return Poll::Pending;
    };
    ready!(sleep.as_mut().poll(cx));
    Poll::Ready(Err(Box::new(*why)))
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
    let mut parts = replay.parts.clone();
    parts.uri = attempts
        .target()
        .uri()
        .expect("the layer's target is made from the request's URI")
        .clone();
    parts.extensions.insert(LayerAttempt);
    let number = attempts.next_attempt(&mut parts.headers);
    parts.extensions.insert(AttemptNumber(number));
    let timer = attempt_timer(attempts);
    let _span = attempts.enter_span();
    (replay.service.call(Request::from_parts(parts, body)), timer)
}

/// A body that could not be sent again after all: the outcome that stops the retries (the
/// last attempt's own outcome was already dropped for the retry).
#[cold]
pub(super) fn refused<R>(
    attempts: &mut Attempts,
    why: NotReplayable,
) -> (Result<R, BoxError>, StopReason) {
    attempts.refuse_replay(why);
    (Err(why.to_string().into()), StopReason::BodyNotReplayable)
}

/// The timer that cuts the next attempt, if the request has a deadline or a per-attempt
/// timeout.
#[inline]
pub(super) fn attempt_timer(attempts: &Attempts) -> AttemptTimer {
    attempts
        .attempt_limit()
        .map(|(limit, why)| (Box::pin(tokio::time::sleep(limit)), why))
}
