//! The request the atomic- and lease-mode handlers take, and the key the layer put on it:
//! shared by the tests of transactions ended by hand, of two modes on one table, and of
//! handlers sharing the store's pool.

use bytes::Bytes;
use http::Request;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use tower_idempotency_keys::RequestKey;

pub(crate) type Req = Request<Either<Full<Bytes>, Incoming>>;

pub(crate) fn key_of(req: &Req) -> String {
    req.extensions()
        .get::<RequestKey>()
        .unwrap()
        .as_str()
        .to_owned()
}
