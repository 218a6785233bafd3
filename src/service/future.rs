use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::request::Parts;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::replay::{keep_stream, Kept};
use super::{KeyHeader, LayerAttempt, NotReplayable, ReplayBody};
use crate::attempt_clock::{when_fired, AttemptClock, Fired};
use crate::attempts::{Attempts, CarriesReport, Outcome, Plan, Step};
use crate::policy::StopReason;
use crate::target::Target;
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
        // Spent once the state is `Done`.
        attempts: Attempts,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B> {
        // An attempt is in flight, cut by `timer` if the policy's clock runs out first (boxed,
        // and only with a deadline or a per-attempt timeout).
        Called { #[pin] future: F, timer: AttemptTimer },
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

pin_project! {
    /// The timer that cuts an attempt, why it would, and the attempt's clock when the attempt
    /// has a per-attempt timeout (a body read inside the attempt is timed frame by frame).
    struct Timer {
        #[pin]
        sleep: Sleep,
        why: TimedOut,
        clock: Option<AttemptClock>,
    }
}

/// The timer that cuts an attempt (`None`: no deadline, no per-attempt timeout). Boxed: only a
/// request with a clock pays for its size.
type AttemptTimer = Option<Pin<Box<Timer>>>;

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
            || crate::classify::host::of_request(&parts.uri, &parts.headers),
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
            KeyHeader::mark(policy, &mut parts.extensions);
        }
        attempts.next_attempt(&mut parts.headers);
        let timer = attempt_timer(&attempts, &mut parts.extensions);
        let future = service.call(Request::from_parts(parts, body));
        ResponseFuture {
            state: State::Called { future, timer },
            retry,
            attempts,
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
            let (result, reason) = match this.state.as_mut().project() {
                StateProj::Called { future, timer } => {
                    let result = ready!(poll_attempt(future, timer, this.attempts, cx));
                    let resend = this
                        .retry
                        .as_ref()
                        .map(|r| r.body.check(responded(&result, this.attempts.is_grpc())));
                    match this.attempts.on_outcome(Outcome::of(&result), resend) {
                        // Finished here rather than below: the response is then not moved
                        // once more on the common path (one response, no retry).
                        Step::Stop(reason) => {
                            return Poll::Ready(stop(
                                this.state,
                                this.retry,
                                this.attempts,
                                result,
                                reason,
                            ))
                        }
                        Step::Wait(after) => {
                            // The failed attempt's response (if any) is dropped here.
                            this.state.set(State::waiting(after));
                            continue;
                        }
                    }
                }
                StateProj::Waiting { sleep, for_body } => {
                    let replay = this.retry.as_ref().expect("a retry keeps its body");
                    match ready!(poll_wait(sleep, for_body, &replay.body, this.attempts, cx)) {
                        Ok(body) => {
                            this.state.set(State::Readying { body });
                            continue;
                        }
                        Err(why) => refused(this.attempts, why),
                    }
                }
                StateProj::Readying { body } => {
                    let replay = this.retry.as_mut().expect("a retry keeps its body");
                    // The clone may be a handle to a shared resource (a buffer, a pool, a
                    // concurrency limit): `call` is only allowed once it says it is ready.
                    if let Err(err) = ready!(replay.service.poll_ready(cx)) {
                        (Err(err.into()), StopReason::ServiceNotReady)
                    } else {
                        // A copy is made now (never pending); a recording came with the state.
                        match body.take().map_or_else(|| replay.body.copy(), Ok) {
                            Ok(body) => {
                                let (future, timer) = resend(replay, this.attempts, body);
                                this.state.set(State::Called { future, timer });
                                continue;
                            }
                            Err(why) => refused(this.attempts, why),
                        }
                    }
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            };
            return Poll::Ready(stop(this.state, this.retry, this.attempts, result, reason));
        }
    }
}

/// The one way a request ends: done, the copy or recording and the retry's service dropped,
/// the outcome finished with its report.
#[inline(always)]
fn stop<F, B, S, Res>(
    mut state: Pin<&mut State<F, B>>,
    retry: &mut Option<Replay<S, B>>,
    attempts: &mut Attempts,
    result: Result<Res, BoxError>,
    reason: StopReason,
) -> Result<Res, Error>
where
    Res: CarriesReport,
{
    state.set(State::Done);
    retry.take();
    attempts.finish(result, reason)
}

impl<F, B> State<F, B> {
    fn waiting(after: Duration) -> Self {
        State::Waiting {
            sleep: Box::pin(tokio::time::sleep(after)),
            for_body: false,
        }
    }
}

/// The wait before a retry: the backoff, then for a recorded body the wait for the last
/// attempt's transport to let go of it, bounded by the same timer, reset. Ready with the next
/// attempt's body when it came from the recording (`None`: a copy, made once the service is
/// ready).
fn poll_wait<B: ReplayBody>(
    sleep: &mut Pin<Box<Sleep>>,
    for_body: &mut bool,
    body: &Kept<B>,
    attempts: &Attempts,
    cx: &mut Context<'_>,
) -> Poll<Result<Option<B>, NotReplayable>> {
    if !*for_body {
        ready!(sleep.as_mut().poll(cx));
        if !body.is_recording() {
            return Poll::Ready(Ok(None));
        }
        sleep.as_mut().reset(Instant::now() + attempts.body_wait());
        *for_body = true;
    }
    match body.poll_next(cx) {
        Poll::Ready(next) => Poll::Ready(next.map(Some)),
        Poll::Pending => {
            ready!(sleep.as_mut().poll(cx));
            Poll::Ready(Err(NotReplayable::StillInUse))
        }
    }
}

/// Polls the attempt in flight, cut by the policy's clock if it runs out first (the attempt is
/// then dropped with its state: cut, maybe sent).
#[inline(always)]
fn poll_attempt<F, R, E>(
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

/// Whether the attempt ended in a response that may have left the body's rest on its way
/// (see [`NotReplayable::ResponseBeforeEnd`]). A gRPC call answered trailers-only is over:
/// the server took none of the rest, and A6 retries it, so its body may be replayed once the
/// transport gives it back.
#[inline]
fn responded<B>(result: &Result<Response<B>, BoxError>, grpc: bool) -> bool {
    match result {
        #[cfg(feature = "tonic")]
        Ok(res) if grpc => !crate::classify::grpc::is_trailers_only(res.headers()),
        Ok(_) => {
            let _ = grpc;
            true
        }
        Err(_) => false,
    }
}

/// Sends the next attempt with `body`.
#[inline]
fn resend<S, B>(
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
    KeyHeader::mark(attempts.policy(), &mut parts.extensions);
    attempts.next_attempt(&mut parts.headers);
    let timer = attempt_timer(attempts, &mut parts.extensions);
    (replay.service.call(Request::from_parts(parts, body)), timer)
}

/// A body that could not be sent again after all: the outcome that stops the retries (the
/// last attempt's own outcome was already dropped for the retry).
#[cold]
fn refused<R>(attempts: &mut Attempts, why: NotReplayable) -> (Result<R, BoxError>, StopReason) {
    attempts.refuse_replay(why);
    (Err(why.to_string().into()), StopReason::BodyNotReplayable)
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
    let (body, tape) = keep_stream(body, headers, policy.replay_buffer());
    match tape {
        Ok(tape) => *kept = Some(tape),
        Err(why) => *why_not = Err(why),
    }
    body
}

/// The timer that cuts the next attempt, if the request has a deadline or a per-attempt
/// timeout; the attempt's clock then goes in its `extensions`.
#[inline]
fn attempt_timer(attempts: &Attempts, extensions: &mut http::Extensions) -> AttemptTimer {
    let (limit, why) = attempts.attempt_limit()?;
    let clock = attempts.clock();
    extensions.insert(clock.clone());
    Some(Box::pin(Timer {
        sleep: tokio::time::sleep(limit),
        why,
        clock: Some(clock),
    }))
}
