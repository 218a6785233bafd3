//! The stack the read-whole tests drive: the retry layer with `ReadWholeLayer` inside it over
//! hyper-util's client, and the bodies they send.

use std::error::Error as StdError;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tower::{BoxError, Service, ServiceBuilder};
use tower_retry_safety::resume::{BodyCutError, ReadWholeLayer, WholeBody};
use tower_retry_safety::RetryPolicy;

/// A body of `len` bytes whose every position can be told from its neighbours'.
pub fn representation(len: usize) -> Bytes {
    (0..len)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// Three retries, short waits, no budget.
pub fn policy() -> tower_retry_safety::RetryPolicyBuilder {
    RetryPolicy::builder()
        .max_retries(3)
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .no_budget()
}

pub fn stack(
    policy: RetryPolicy,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<WholeBody<hyper::body::Incoming>>,
    Error = tower_retry_safety::Error,
> + Clone {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    ServiceBuilder::new()
        .layer(policy)
        .layer(ReadWholeLayer::new())
        .service(client)
}

/// The body's bytes up to its end or its error (pass `&mut body` to keep the body, for its
/// report).
pub async fn read_all<B>(mut body: B) -> (Vec<u8>, Option<BoxError>)
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Some(data) = frame.data_ref() {
                    bytes.extend_from_slice(data);
                }
            }
            Err(err) => return (bytes, Some(err.into())),
        }
    }
    (bytes, None)
}

/// The `BodyCutError` in an error's chain, if there is one.
pub fn find_cut<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a BodyCutError> {
    let mut source: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(cut) = e.downcast_ref::<BodyCutError>() {
            return Some(cut);
        }
        source = e.source();
    }
    None
}
