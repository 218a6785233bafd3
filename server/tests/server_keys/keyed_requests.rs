//! What the server layer's edge-case tests send and read: the request type the handlers take,
//! a keyed POST, a response body read whole, and a chunk of a streamed body.

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Either, Full};
use tower::BoxError;

pub(crate) type In = Request<Either<Full<Bytes>, Full<Bytes>>>;

pub(crate) fn keyed(key: &str, body: &'static str) -> Request<Full<Bytes>> {
    Request::post("/v1/messages")
        .header("idempotency-key", format!("\"{key}\""))
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

pub(crate) async fn body_of<B: http_body::Body>(res: Response<B>) -> Bytes
where
    B::Error: std::fmt::Debug,
{
    res.into_body().collect().await.unwrap().to_bytes()
}

pub(crate) type Chunk = Result<Frame<Bytes>, BoxError>;
