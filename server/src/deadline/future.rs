//! The response future: the inner call in the deadline's scope, or the layer's own answer.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::Response;
use http_body_util::Either;
use pin_project_lite::pin_project;
use tokio::task::futures::TaskLocalFuture;
use tower_retry_safety::deadline::Inbound;

use super::answer::{caller_gone, Note};

pin_project! {
    /// The response future of [`Deadline`](super::Deadline).
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
        note: Option<Note>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // The inner service's future, in the deadline's scope.
        Scoped { #[pin] future: TaskLocalFuture<Inbound, F> },
        // The caller had gone: answered at once (taken when polled).
        Gone { grpc: bool },
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn scoped(future: TaskLocalFuture<Inbound, F>, note: Option<Note>) -> Self {
        ResponseFuture {
            state: State::Scoped { future },
            note,
        }
    }

    pub(crate) fn gone(grpc: bool, note: Option<Note>) -> Self {
        ResponseFuture {
            state: State::Gone { grpc },
            note,
        }
    }
}

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<Either<B, http_body_util::Empty<bytes::Bytes>>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut res = match this.state.project() {
            StateProj::Scoped { future } => ready!(future.poll(cx))?.map(Either::Left),
            StateProj::Gone { grpc } => caller_gone(*grpc).map(Either::Right),
        };
        Note::mark(*this.note, &mut res);
        Poll::Ready(Ok(res))
    }
}
