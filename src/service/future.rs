//! The future of [`RetrySafety`](super::RetrySafety)'s calls.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::hedged::{self, Hedged};
use super::kept::{keep_stream, Kept};
use super::send::{attempt_timer, poll_attempt, poll_resend, refused, AttemptTimer, Head, Replay};
use super::{KeyHeader, LayerAttempt, NotReplayable, ReplayBody};
use crate::attempts::Error;
use crate::attempts::{Attempts, CarriesReport, Outcome, Plan, Step};
use crate::box_error::BoxError;
use crate::policy::RetryPolicy;
use crate::policy::StopReason;
use crate::target::Target;

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
        // body when it came from the recording (a copy is made once the service is ready),
        // until the request's deadline if it has one (boxed, and only with a deadline).
        Readying { body: Option<B>, deadline: Option<Pin<Box<Sleep>>> },
        // A hedged request: its attempts in flight, boxed (only a hedged request pays for it).
        Hedged { hedged: Box<Hedged<F>> },
        // Not sent: the caller's deadline had passed before the first attempt.
        CallerGone,
        // The outcome was returned.
        Done,
    }
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
            State::Hedged { .. } => "hedging",
            State::CallerGone => "caller gone",
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
            || host_seen::<B>(&parts),
            authority::<B>(&parts),
            parts.uri.path(),
            &parts.headers,
            &parts.extensions,
        );
        plan.mint_key(policy, &mut parts.headers);
        plan.read_errors_with(B::stack_errors());
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
        if attempts.caller_gone() {
            return ResponseFuture {
                state: State::CallerGone,
                retry: None,
                attempts,
            };
        }
        // One branch when the policy does not hedge.
        let hedge = match policy.hedging() {
            None => None,
            Some(_) => attempts.plan_hedge(
                || {
                    crate::classify::host::of_request(&parts.uri, &parts.headers, parts.version)
                        .named()
                },
                matches!(kept, Some(Kept::Copy(_))),
            ),
        };
        let retry = kept.map(|body| Replay {
            service: service.clone(),
            head: Head::copy_of(&parts),
            body,
        });
        // Marked on each attempt rather than in the copy: the copy's extensions stay as the
        // caller left them, and cloning them costs nothing when they are empty.
        if marks_attempts {
            parts.extensions.insert(LayerAttempt);
            KeyHeader::mark(policy, &mut parts.extensions);
        }
        attempts.next_attempt(&mut parts.headers);
        let timer = attempt_timer(&mut attempts, &mut parts.extensions);
        // Entered for `call` too: a tracing layer further in may open its span there.
        let future = {
            let _span = attempts.enter_span();
            service.call(Request::from_parts(parts, body))
        };
        let state = match hedge {
            None => State::Called { future, timer },
            Some(delay) => State::Hedged {
                hedged: Box::new(Hedged::new(future, timer, delay, attempts.span().clone())),
            },
        };
        ResponseFuture {
            state,
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
                    let span = this.attempts.enter_span();
                    let result = ready!(poll_attempt(future, timer, this.attempts, cx));
                    drop(span);
                    let resend = may_resend(this.retry, &result, this.attempts);
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
                            let deadline = this.attempts.deadline_at().map(|at| {
                                sleep.as_mut().reset(at);
                                std::mem::replace(
                                    sleep,
                                    Box::pin(tokio::time::sleep(Duration::ZERO)),
                                )
                            });
                            this.state.set(State::Readying { body, deadline });
                            continue;
                        }
                        Err(why) => refused(this.attempts, why),
                    }
                }
                StateProj::Readying { body, deadline } => {
                    let replay = this.retry.as_mut().expect("a retry keeps its body");
                    match ready!(poll_resend(replay, body, deadline, this.attempts, cx)) {
                        Ok((future, timer)) => {
                            this.state.set(State::Called { future, timer });
                            continue;
                        }
                        Err(ended) => ended,
                    }
                }
                StateProj::Hedged { hedged } => {
                    let replay = this
                        .retry
                        .as_mut()
                        .expect("a hedged request keeps its body");
                    ready!(hedged::poll(hedged, replay, this.attempts, cx))
                }
                StateProj::CallerGone => this.attempts.refuse_at_caller_deadline(),
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            };
            return Poll::Ready(stop(this.state, this.retry, this.attempts, result, reason));
        }
    }
}

/// What the request says of its host. Below a client that sends every request to its own
/// endpoint (tonic's `Channel`) it names none: only the policy's origin says where it goes.
#[inline]
fn host_seen<B: ReplayBody>(parts: &http::request::Parts) -> crate::classify::host::HostSeen<'_> {
    if B::stack_errors().rewrites_authority {
        return crate::classify::host::HostSeen::Nothing;
    }
    crate::classify::host::of_request(&parts.uri, &parts.headers, parts.version)
}

/// The URI's authority as written, when it names where the request goes (not below a stack
/// that rewrites it).
#[inline]
fn authority<B: ReplayBody>(parts: &http::request::Parts) -> Option<&str> {
    if B::stack_errors().rewrites_authority {
        return None;
    }
    parts.uri.authority().map(http::uri::Authority::as_str)
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

/// Whether the body could be sent again after this attempt: `None` when nothing was kept.
#[inline]
fn may_resend<S, B: ReplayBody, R>(
    retry: &Option<Replay<S, B>>,
    result: &Result<Response<R>, BoxError>,
    attempts: &Attempts,
) -> Option<Result<(), NotReplayable>> {
    let replay = retry.as_ref()?;
    Some(replay.body.check(responded(result, attempts.is_grpc())))
}

/// Whether the attempt ended in a response that may have left the body's rest on its way
/// (see [`NotReplayable::ResponseBeforeEnd`]). A gRPC call answered trailers-only is over:
/// the server took none of the rest, and A6 retries it, so its body may be replayed once the
/// transport gives it back.
#[inline]
fn responded<B>(result: &Result<Response<B>, BoxError>, grpc: bool) -> bool {
    match result {
        Ok(res) if grpc => !crate::classify::grpc::is_trailers_only(res.headers()),
        Ok(_) => true,
        Err(_) => false,
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
    let (body, tape) = keep_stream(body, headers, policy.replay_buffer());
    match tape {
        Ok(tape) => *kept = Some(tape),
        Err(why) => *why_not = Err(why),
    }
    body
}
