use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::request::Parts;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_service::Service;

use super::replay::{keep_stream, Kept, LET_GO_WAIT};
use super::{LayerAttempt, NotReplayable, ReplayBody};
use crate::attempts::{Attempts, Plan, Target};
use crate::classify::BodyVerdict;
use crate::policy::{Decision, StopReason};
use crate::timed_out::TimedOut;
use crate::{BoxError, Error, RetryPolicy};

pin_project! {
    /// The response future of [`RetrySafety`](super::RetrySafety): sends the request, waits,
    /// and sends it again as the policy allows.
    ///
    /// Dropping it at any point stops the retries: nothing more is sent.
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S::Future, B>,
        retry: Option<Replay<S, B>>,
        attempts: Option<Attempts>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B> {
        // An attempt is in flight, cut by `timer` if the policy's clock runs out first (boxed,
        // and only with a deadline or a per-attempt timeout).
        Called { #[pin] future: F, timer: Option<(Pin<Box<Sleep>>, TimedOut)> },
        // Waiting out the backoff or the server's Retry-After. Boxed: only a retry pays for
        // the timer's size, not every request's future.
        // Then, for a recorded body (`for_body`), the same timer bounds the wait for the last
        // attempt's transport to let go of the recording.
        Waiting { sleep: Pin<Box<Sleep>>, for_body: bool },
        // Waiting for the inner service to accept the next attempt, with the next attempt's
        // body when it came from the recording (a copy is made once the service is ready).
        Readying { body: Option<B> },
        // The outcome was returned.
        Done,
    }
}

/// What a retry needs: a service of its own and a copy of the request. The copy has no URI:
/// the attempts' target keeps the one copy of it.
struct Replay<S, B> {
    service: S,
    parts: Parts,
    body: Kept<B>,
}

/// The request's parts but its URI, which stays the default (`/`, no allocation).
fn parts_without_uri(parts: &Parts) -> Parts {
    let (mut copy, ()) = Request::new(()).into_parts();
    copy.method = parts.method.clone();
    copy.version = parts.version;
    copy.headers = parts.headers.clone();
    copy.extensions = parts.extensions.clone();
    copy
}

impl<S, B> std::fmt::Debug for ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Called { .. } => "attempt in flight",
            State::Waiting {
                for_body: false, ..
            } => "waiting before retry",
            State::Waiting { for_body: true, .. } => "waiting for the body",
            State::Readying { .. } => "waiting for the service",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("replayable", &self.retry.is_some())
            .finish()
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<B>> + Clone,
    B: ReplayBody,
{
    /// Sends the first attempt through `service`, which must be ready.
    pub(crate) fn start(service: &mut S, policy: &RetryPolicy, req: Request<B>) -> Self {
        let (mut parts, body) = req.into_parts();
        let mut plan = Plan::new(
            policy,
            &parts.method,
            || {
                let uri = &parts.uri;
                Some((uri.host()?, crate::classify::host::effective_port(uri)))
            },
            parts.uri.path(),
            &parts.headers,
            &parts.extensions,
        );
        plan.mint_key(policy, &mut parts.headers);
        // Copy or record the body only if the request could ever be sent again. Written to
        // move the body as little as possible: a copyable body is the common case.
        let mut kept = None;
        let mut why_not = Ok(());
        let body = if plan.may_retry(policy) {
            match body.try_clone_body() {
                Some(copy) => {
                    kept = Some(Kept::Copy(copy));
                    body
                }
                None => record(body, &parts.headers, policy, &mut kept, &mut why_not),
            }
        } else {
            body
        };
        let marks_attempts = plan.marks_attempts();
        let target = Target::from_uri(parts.method.clone(), parts.uri.clone());
        let mut attempts = Attempts::start(policy, plan, target, why_not);
        let retry = kept.map(|body| Replay {
            service: service.clone(),
            parts: parts_without_uri(&parts),
            body,
        });
        // Marked on each attempt rather than in the copy: the copy's extensions stay as the
        // caller left them, and cloning them costs nothing when they are empty.
        if marks_attempts {
            parts.extensions.insert(LayerAttempt);
        }
        attempts.next_attempt(&mut parts.headers);
        let timer = attempt_timer(&attempts);
        let future = service.call(Request::from_parts(parts, body));
        ResponseFuture {
            state: State::Called { future, timer },
            retry,
            attempts: Some(attempts),
        }
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
    S::Error: Into<BoxError>,
    B: ReplayBody,
{
    type Output = Result<Response<ResBody>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Called { future, timer } => {
                    let result = match future.poll(cx) {
                        Poll::Ready(result) => result.map_err(Into::<BoxError>::into),
                        Poll::Pending => {
                            let Some((sleep, why)) = timer else {
                                return Poll::Pending;
                            };
                            ready!(sleep.as_mut().poll(cx));
                            // The attempt is dropped with this state: cut, maybe sent.
                            Err(Box::new(*why) as BoxError)
                        }
                    };
                    let Some(attempts) = this.attempts.as_mut() else {
                        panic!("ResponseFuture polled after completion");
                    };
                    if let Some(replay) = this.retry.as_ref() {
                        if let Err(why) = replay.body.check(result.is_ok()) {
                            attempts.refuse_replay(why);
                        }
                    }
                    let decision = match &result {
                        Ok(res) => {
                            attempts.on_response(res.status(), res.headers(), res.extensions())
                        }
                        Err(err) => attempts.on_error(&**err),
                    };
                    match decision {
                        Decision::Retry { after } if this.retry.is_some() => {
                            // The failed attempt's response (if any) is dropped here.
                            this.state.set(State::Waiting {
                                for_body: false,
                                sleep: Box::pin(tokio::time::sleep(after)),
                            });
                        }
                        Decision::Retry { .. } => {
                            this.state.set(State::Done);
                            // The copy or recording, and the retry's service, go now.
                            this.retry.take();
                            return Poll::Ready(finish(
                                this.attempts,
                                result,
                                StopReason::BodyNotReplayable,
                            ));
                        }
                        Decision::Stop(reason) => {
                            this.state.set(State::Done);
                            // The copy or recording, and the retry's service, go now.
                            this.retry.take();
                            return Poll::Ready(finish(this.attempts, result, reason));
                        }
                    }
                }
                StateProj::Waiting {
                    sleep,
                    for_body: for_body @ false,
                } => {
                    ready!(sleep.as_mut().poll(cx));
                    let recording = this.retry.as_ref().is_some_and(|r| r.body.is_recording());
                    if recording {
                        // The backoff's timer, reset to bound the wait for the body.
                        let wait = this
                            .attempts
                            .as_ref()
                            .and_then(Attempts::time_left)
                            .map_or(LET_GO_WAIT, |left| left.min(LET_GO_WAIT));
                        sleep.as_mut().reset(tokio::time::Instant::now() + wait);
                        *for_body = true;
                    } else {
                        this.state.set(State::Readying { body: None });
                    }
                }
                StateProj::Waiting { sleep, .. } => {
                    let Some(replay) = this.retry.as_mut() else {
                        panic!("ResponseFuture polled after completion");
                    };
                    let why = match replay.body.poll_next(cx) {
                        Poll::Ready(Ok(body)) => {
                            this.state.set(State::Readying { body: Some(body) });
                            continue;
                        }
                        Poll::Ready(Err(why)) => why,
                        Poll::Pending => {
                            ready!(sleep.as_mut().poll(cx));
                            NotReplayable::StillInUse
                        }
                    };
                    this.state.set(State::Done);
                    // The copy or recording, and the retry's service, go now.
                    this.retry.take();
                    let attempts = this.attempts.take().expect("checked above");
                    return Poll::Ready(Err(attempts.into_body_refused(why)));
                }
                StateProj::Readying { body: recorded } => {
                    let (Some(replay), Some(attempts)) =
                        (this.retry.as_mut(), this.attempts.as_mut())
                    else {
                        panic!("ResponseFuture polled after completion");
                    };
                    // The clone may be a handle to a shared resource (a buffer, a pool, a
                    // concurrency limit): `call` is only allowed once it says it is ready.
                    if let Err(err) = ready!(replay.service.poll_ready(cx)) {
                        this.state.set(State::Done);
                        // The copy or recording, and the retry's service, go now.
                        this.retry.take();
                        let attempts = this.attempts.take().expect("checked above");
                        return Poll::Ready(Err(
                            attempts.into_error(StopReason::ServiceNotReady, err.into())
                        ));
                    }
                    let next = match recorded.take() {
                        Some(body) => Ok(body),
                        // A copy: never pending.
                        None => match replay.body.poll_next(cx) {
                            Poll::Ready(next) => next,
                            Poll::Pending => Err(NotReplayable::StillInUse),
                        },
                    };
                    let body = match next {
                        Ok(body) => body,
                        // A body that copied once but not twice: stop with what we know.
                        Err(why) => {
                            this.state.set(State::Done);
                            // The copy or recording, and the retry's service, go now.
                            this.retry.take();
                            let attempts = this.attempts.take().expect("checked above");
                            return Poll::Ready(Err(attempts.into_body_refused(why)));
                        }
                    };
                    let mut parts = replay.parts.clone();
                    parts.uri = attempts
                        .target()
                        .uri()
                        .expect("the layer's target is made from the request's URI")
                        .clone();
                    parts.extensions.insert(LayerAttempt);
                    attempts.next_attempt(&mut parts.headers);
                    let timer = attempt_timer(attempts);
                    let future = replay.service.call(Request::from_parts(parts, body));
                    this.state.set(State::Called { future, timer });
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}

/// Records a body that cannot be copied, within the policy's replay buffer.
#[cold]
fn record<B: ReplayBody>(
    body: B,
    headers: &http::HeaderMap,
    policy: &RetryPolicy,
    kept: &mut Option<Kept<B>>,
    why_not: &mut Result<(), NotReplayable>,
) -> B {
    let (body, tape) = keep_stream(body, headers, policy.inner.replay_buffer);
    match tape {
        Ok(tape) => *kept = Some(tape),
        Err(why) => *why_not = Err(why),
    }
    body
}

/// The timer that cuts the next attempt, if the request has a deadline or a per-attempt
/// timeout.
#[inline]
fn attempt_timer(attempts: &Attempts) -> Option<(Pin<Box<Sleep>>, TimedOut)> {
    attempts
        .attempt_limit()
        .map(|(limit, why)| (Box::pin(tokio::time::sleep(limit)), why))
}

// Inlined, and the report taken from the attempts in place: this saves moving the bookkeeping
// and the response around, 77 instructions per request (scripts/instructions.sh).
#[inline]
fn finish<ResBody>(
    slot: &mut Option<Attempts>,
    result: Result<Response<ResBody>, BoxError>,
    reason: StopReason,
) -> Result<Response<ResBody>, Error> {
    match result {
        Ok(mut res) => {
            let Some(attempts) = slot.as_mut() else {
                panic!("ResponseFuture polled after completion");
            };
            // An outer layer of this crate writes the report; ours would be overwritten.
            if reason != StopReason::RetriedByOuterLayer {
                BodyVerdict::take(res.extensions_mut());
                res.extensions_mut().insert(attempts.take_report(reason));
            }
            *slot = None;
            Ok(res)
        }
        Err(err) => {
            let Some(attempts) = slot.take() else {
                panic!("ResponseFuture polled after completion");
            };
            Err(attempts.into_error(reason, err))
        }
    }
}
