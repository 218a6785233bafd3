//! The response body: polled in the deadline's scope, so that a nested call made while hyper
//! polls a streamed body, after the handler's future has ended, still inherits it.

use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_retry_safety::deadline::{self, Inbound};

pin_project! {
    /// The response body of [`Deadline`](super::Deadline): the inner service's body, each
    /// frame polled in the caller's deadline's scope, or the empty body of the layer's own
    /// answer.
    pub struct DeadlineBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Scoped { inbound: Inbound, #[pin] body: B },
        Answer,
    }
}

impl<B> DeadlineBody<B> {
    pub(crate) fn scoped(inbound: Inbound, body: B) -> Self {
        DeadlineBody {
            kind: Kind::Scoped { inbound, body },
        }
    }

    pub(crate) fn answer() -> Self {
        DeadlineBody { kind: Kind::Answer }
    }
}

/// Says which kind of body it is; never its content.
impl<B> std::fmt::Debug for DeadlineBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            Kind::Scoped { .. } => "scoped",
            Kind::Answer => "answer",
        };
        f.debug_struct("DeadlineBody")
            .field("kind", &kind)
            .finish_non_exhaustive()
    }
}

impl<B: Body> Body for DeadlineBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Scoped { inbound, body } => {
                // The task-local is set for this one poll, and unset before hyper's task goes
                // on to other work.
                deadline::sync_scope(*inbound, || body.poll_frame(cx))
            }
            KindProj::Answer => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Scoped { body, .. } => body.is_end_stream(),
            Kind::Answer => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Scoped { body, .. } => body.size_hint(),
            Kind::Answer => SizeHint::with_exact(0),
        }
    }
}
