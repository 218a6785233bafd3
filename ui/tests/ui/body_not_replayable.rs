// A request body the retry layer cannot send again: the error names `Replayable::new` and the
// bodies that work.
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame};
use tower::{service_fn, Layer, Service};
use tower_retry_safety::RetryPolicy;

/// A streaming body of the caller's own.
struct Upload;

impl Body for Upload {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(None)
    }
}

fn main() {
    let policy = RetryPolicy::builder().build().unwrap();
    let mut svc = policy.layer(service_fn(|_req: http::Request<Upload>| async {
        Ok::<_, Infallible>(http::Response::new(()))
    }));
    let _ = Service::call(&mut svc, http::Request::new(Upload));
}
