//! The future of [`PeekBody`](super::PeekBody)'s calls.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::Response;
use http_body::Body;
use pin_project_lite::pin_project;

use super::classifier::Classifier;
use super::PeekedBody;
use crate::classify::BodyVerdict;

type Reading<B> = Pin<Box<dyn Future<Output = Response<PeekedBody<B>>> + Send>>;

pin_project! {
    /// The response future of [`PeekBody`](crate::peek::PeekBody).
    pub struct ResponseFuture<F, B: Body> {
        #[pin]
        state: State<F, B>,
        classifier: Arc<Classifier>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B: Body> {
        Calling { #[pin] future: F },
        // Boxed: only a response whose body is read pays for the reading's state.
        Reading { reading: Reading<B> },
    }
}

impl<F, B: Body> ResponseFuture<F, B> {
    pub(crate) fn new(future: F, classifier: Arc<Classifier>) -> Self {
        ResponseFuture {
            state: State::Calling { future },
            classifier,
        }
    }
}

impl<F, B: Body> std::fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Calling { .. } => "calling",
            State::Reading { .. } => "reading the body",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Send,
{
    type Output = Result<Response<PeekedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Calling { future } => {
                    let res = ready!(future.poll(cx))?;
                    let exact = res.body().size_hint().exact();
                    if !this.classifier.wants(res.status(), res.headers(), exact) {
                        return Poll::Ready(Ok(res.map(PeekedBody::unread)));
                    }
                    let classifier = Arc::clone(this.classifier);
                    let reading = Box::pin(async move {
                        let (mut parts, body) = res.into_parts();
                        let (body, class) =
                            classifier.read(parts.status, &parts.headers, body).await;
                        if let Some(class) = class {
                            BodyVerdict::add(&mut parts.extensions, class);
                        }
                        Response::from_parts(parts, body)
                    });
                    this.state.set(State::Reading { reading });
                }
                StateProj::Reading { reading } => {
                    return Poll::Ready(Ok(ready!(reading.as_mut().poll(cx))));
                }
            }
        }
    }
}
