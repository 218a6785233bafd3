//! The future and the body of [`Deadline`](super::Deadline)'s responses.
//!
//! [`DeadlineFuture`] is the wait for the inner service to be ready (timed by the caller's
//! deadline), then the inner call in the deadline's scope, or the layer's own answer;
//! [`DeadlineBody`] is each frame of the response polled in the deadline's scope.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::Response;
use pin_project_lite::pin_project;
use tokio::task::futures::TaskLocalFuture;
use tokio::time::Sleep;
use tower_retry_safety::deadline::{self, Inbound};
use tower_service::Service;

use super::answer::caller_gone;
pub use super::body::DeadlineBody;
use super::note::Notes;

pin_project! {
    /// The response future of [`Deadline`](super::Deadline).
    pub struct DeadlineFuture<S: Service<Req>, Req> {
        #[pin]
        state: State<S, Req>,
        inbound: Inbound,
        notes: Notes,
        grpc: bool,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S: Service<Req>, Req> {
        // Waiting for the inner service (its own clone) to be ready, until the deadline.
        Waiting {
            service: S,
            req: Option<Req>,
            // Set once the service has said it is not ready: a ready one costs no timer.
            #[pin]
            timer: Option<Sleep>,
            // The runtime has no timer: the wait ends only when the service is ready.
            untimed: bool,
        },
        // The inner service's future, in the deadline's scope.
        Called { #[pin] future: TaskLocalFuture<Inbound, S::Future> },
        // The caller had gone before the inner service was called.
        Gone,
        Done,
    }
}

impl<S: Service<Req>, Req> DeadlineFuture<S, Req> {
    pub(crate) fn waiting(
        service: S,
        req: Req,
        inbound: Inbound,
        notes: Notes,
        grpc: bool,
    ) -> Self {
        let state = State::Waiting {
            service,
            req: Some(req),
            timer: None,
            untimed: false,
        };
        DeadlineFuture {
            state,
            inbound,
            notes,
            grpc,
        }
    }

    pub(crate) fn gone(inbound: Inbound, notes: Notes, grpc: bool) -> Self {
        DeadlineFuture {
            state: State::Gone,
            inbound,
            notes,
            grpc,
        }
    }
}

impl<S: Service<Req>, Req> std::fmt::Debug for DeadlineFuture<S, Req> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Waiting { .. } => "waiting",
            State::Called { .. } => "called",
            State::Gone => "gone",
            State::Done => "done",
        };
        f.debug_struct("DeadlineFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

impl<S, Req, B> Future for DeadlineFuture<S, Req>
where
    S: Service<Req, Response = Response<B>>,
{
    type Output = Result<Response<DeadlineBody<B>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Waiting {
                    service,
                    req,
                    mut timer,
                    untimed,
                } => match service.poll_ready(cx) {
                    Poll::Ready(Ok(())) => {
                        // The last check, right before the inner service is called: a wait
                        // for it to be ready counts against the caller's deadline.
                        if this.inbound.has_passed() {
                            this.state.set(State::Gone);
                            continue;
                        }
                        let req = req.take().expect("a waiting future holds its request");
                        // `call` itself runs in the deadline too: a service may start its
                        // nested call there, before its future is first polled.
                        let inbound = *this.inbound;
                        let future = deadline::sync_scope(inbound, || service.call(req));
                        let future = deadline::scope(inbound, future);
                        this.state.set(State::Called { future });
                    }
                    Poll::Ready(Err(err)) => {
                        this.state.set(State::Done);
                        return Poll::Ready(Err(err));
                    }
                    Poll::Pending => {
                        if timer.is_none() && !*untimed {
                            let at = this.inbound.deadline();
                            // Panics on a runtime without a timer (`enable_time`).
                            match catch_unwind(AssertUnwindSafe(|| tokio::time::sleep_until(at))) {
                                Ok(sleep) => timer.set(Some(sleep)),
                                Err(_) => *untimed = true,
                            }
                        }
                        if let Some(sleep) = timer.as_mut().as_pin_mut() {
                            if sleep.poll(cx).is_ready() {
                                // The caller is answered at its deadline, not after the wait;
                                // the ready-to-be service is dropped with its place in line.
                                this.state.set(State::Gone);
                                continue;
                            }
                        }
                        return Poll::Pending;
                    }
                },
                StateProj::Called { future } => {
                    let res = ready!(future.poll(cx));
                    this.state.set(State::Done);
                    let inbound = *this.inbound;
                    let mut res = res?.map(|body| DeadlineBody::scoped(inbound, body));
                    std::mem::take(this.notes).mark(&mut res);
                    return Poll::Ready(Ok(res));
                }
                StateProj::Gone => {
                    this.state.set(State::Done);
                    let mut res = caller_gone(*this.grpc).map(|()| DeadlineBody::answer());
                    std::mem::take(this.notes).mark(&mut res);
                    return Poll::Ready(Ok(res));
                }
                StateProj::Done => panic!("Deadline's future polled after it completed"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::Arc;
    use std::time::Duration;

    use http::{Request, Response, StatusCode};
    use tokio::sync::Semaphore;
    use tokio::time::Instant;
    use tower::limit::ConcurrencyLimit;
    use tower::{service_fn, Layer, ServiceExt};

    use crate::deadline::DeadlineLayer;

    /// issue 48, item 3, on tokio's paused clock: a request queued behind a
    /// `ConcurrencyLimit(1)` is answered 504 at its deadline, counted from its arrival, while
    /// the permit is still held; its handler never runs.
    #[tokio::test(start_paused = true)]
    async fn a_wait_for_readiness_ends_at_the_deadline() {
        let gate = Arc::new(Semaphore::new(0));
        let held = gate.clone();
        let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = runs.clone();
        let handler = service_fn(move |_req: Request<()>| {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let held = held.clone();
            async move {
                let _ = held.acquire().await;
                Ok::<_, Infallible>(Response::new(String::new()))
            }
        });
        let svc =
            DeadlineLayer::new(Duration::from_secs(10)).layer(ConcurrencyLimit::new(handler, 1));
        let first = tokio::spawn(svc.clone().oneshot(Request::new(())));
        tokio::task::yield_now().await;
        let arrival = Instant::now();
        let req = Request::get("/")
            .header("request-timeout-ms", "100")
            .body(())
            .expect("request");
        let res = svc.clone().oneshot(req).await.expect("answer");
        assert_eq!(res.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(arrival.elapsed(), Duration::from_millis(100));
        assert_eq!(
            runs.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "only the first ran"
        );
        gate.add_permits(1);
        assert_eq!(
            first.await.expect("task").expect("answer").status(),
            StatusCode::OK
        );
    }
}
