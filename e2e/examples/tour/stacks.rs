//! The stacks the tour compares, as senders: tower's `retry` with the policy people
//! typically write, tower's `hedge` cloning every request, and a reqwest client.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tower::retry::Policy;
use tower::{BoxError, Service, ServiceExt};

use crate::fault_server::Fault;
use crate::{Req, Sender};

fn request(method: Method, url: &str, fault: Fault) -> Req {
    Request::builder()
        .method(method)
        .uri(url)
        .header("x-fault", fault.name())
        .body(Full::new(Bytes::from_static(b"{\"to\":\"a@example.com\"}")))
        .expect("valid request")
}

/// The retry policy people typically write for tower::retry: retry errors, 5xx and 429, up
/// to 3 times, with a short pause.
#[derive(Clone)]
pub(crate) struct TypicalPolicy {
    pub(crate) left: u32,
}

impl Policy<Req, Response<Incoming>, BoxError> for TypicalPolicy {
    type Future = Pin<Box<tokio::time::Sleep>>;

    fn retry(
        &mut self,
        _req: &mut Req,
        result: &mut Result<Response<Incoming>, BoxError>,
    ) -> Option<Self::Future> {
        let transient = match result {
            Ok(res) => res.status().is_server_error() || res.status() == 429,
            Err(_) => true,
        };
        if !transient || self.left == 0 {
            return None;
        }
        self.left -= 1;
        Some(Box::pin(tokio::time::sleep(Duration::from_millis(20))))
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        let mut copy = Request::new(req.body().clone());
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        *copy.headers_mut() = req.headers().clone();
        Some(copy)
    }
}

/// tower's `hedge` with the policy its docs suggest for any request: clone it.
#[derive(Clone)]
pub(crate) struct HedgeAll;

impl tower::hedge::Policy<Req> for HedgeAll {
    fn clone_request(&self, req: &Req) -> Option<Req> {
        let mut copy = Request::new(req.body().clone());
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        *copy.headers_mut() = req.headers().clone();
        Some(copy)
    }

    fn can_retry(&self, _req: &Req) -> bool {
        true
    }
}

/// Wraps any tower stack over hyper-util's client as a `Sender`.
pub(crate) fn tower_sender<S, E>(svc: S) -> Sender
where
    S: Service<Req, Response = Response<Incoming>, Error = E> + Clone + Send + Sync + 'static,
    S::Future: Send,
    E: Send + 'static,
{
    Arc::new(move |method, url, fault| {
        let svc = svc.clone();
        Box::pin(async move {
            let res = svc.oneshot(request(method, &url, fault)).await.ok()?;
            let status = res.status().as_u16();
            res.into_body().collect().await.ok()?;
            Some(status)
        })
    })
}

pub(crate) fn reqwest_sender(client: reqwest_middleware::ClientWithMiddleware) -> Sender {
    Arc::new(move |method, url, fault| {
        let client = client.clone();
        Box::pin(async move {
            let res = client
                .request(method, url)
                .header("x-fault", fault.name())
                .body("{\"to\":\"a@example.com\"}")
                .send()
                .await
                .ok()?;
            let status = res.status().as_u16();
            res.bytes().await.ok()?;
            Some(status)
        })
    })
}
