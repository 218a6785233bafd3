//! Futures and bodies: the response future of
//! [`IdempotencyService`](crate::service::IdempotencyService) and its response body, and with
//! `axum` the future of `AxumIdempotencyService`.
//!
//! [`ResponseFuture`] is a reply made without calling the handler, the inner service's own
//! future for a request without a key, or the keyed call, boxed (it owns the handler's future
//! and may outlive the request).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::Response;
use pin_project_lite::pin_project;

#[cfg(feature = "axum")]
mod axum;

#[cfg(feature = "axum")]
pub use self::axum::AxumResponseFuture;
pub use crate::body::ResponseBody;

/// A keyed call: boxed once, since it may be detached from the request (see the module docs).
pub(crate) type KeyedCall<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<ResponseBody<B>>, E>> + Send>>;

pin_project! {
    /// The response future of [`IdempotencyService`](crate::service::IdempotencyService).
    pub struct ResponseFuture<F, B, E> {
        #[pin]
        kind: Kind<F, B, E>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, B, E> {
        /// Answered without the handler (a malformed or missing key).
        Reply { response: Option<Response<ResponseBody<B>>> },
        /// A request without a key: the inner service's future, untouched.
        Passthrough { #[pin] future: F },
        /// A request with a key.
        Keyed { call: KeyedCall<B, E> },
    }
}

impl<F, B, E> ResponseFuture<F, B, E> {
    pub(crate) fn reply(response: Response<ResponseBody<B>>) -> Self {
        ResponseFuture {
            kind: Kind::Reply {
                response: Some(response),
            },
        }
    }

    pub(crate) fn passthrough(future: F) -> Self {
        ResponseFuture {
            kind: Kind::Passthrough { future },
        }
    }

    pub(crate) fn keyed(call: KeyedCall<B, E>) -> Self {
        ResponseFuture {
            kind: Kind::Keyed { call },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Reply { response } => Poll::Ready(Ok(response
                .take()
                .expect("IdempotencyService's future polled after it completed"))),
            KindProj::Passthrough { future } => {
                let res = ready!(future.poll(cx))?;
                Poll::Ready(Ok(
                    res.map(|body| ResponseBody::stream(Bytes::new(), None, None, body))
                ))
            }
            KindProj::Keyed { call } => call.as_mut().poll(cx),
        }
    }
}

impl<F, B, E> fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            Kind::Reply { .. } => "Reply",
            Kind::Passthrough { .. } => "Passthrough",
            Kind::Keyed { .. } => "Keyed",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish()
    }
}
