//! Reads whose body is cut mid-way: 120 GETs per stack, half of 16 KiB and half of 1 MiB,
//! from a server that supports `Range`; the first response of half of them is cut.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tower::{Service, ServiceExt};

use crate::{cut_server, Req};

/// GETs per body size in the cut-body table.
pub(crate) const CUT_OPS_PER_SIZE: usize = 60;

/// Sends one GET with `x-cut-first` (the server cuts the path's first response after that
/// many bytes of body, if `Some`); the body the caller read whole, or `None`.
pub(crate) type GetSender = Arc<dyn Fn(String, Option<usize>) -> GetFut + Send + Sync>;
type GetFut = Pin<Box<dyn Future<Output = Option<Bytes>> + Send>>;

pub(crate) fn tower_get<S, B, E>(svc: S) -> GetSender
where
    S: Service<Req, Response = Response<B>, Error = E> + Clone + Send + Sync + 'static,
    S::Future: Send,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    E: Send + 'static,
{
    Arc::new(move |url, cut| {
        let svc = svc.clone();
        Box::pin(async move {
            let mut req = Request::get(url);
            if let Some(cut) = cut {
                req = req.header("x-cut-first", cut);
            }
            let req = req.body(Full::default()).expect("valid request");
            let res = svc.oneshot(req).await.ok()?;
            Some(res.into_body().collect().await.ok()?.to_bytes())
        })
    })
}

pub(crate) fn reqwest_get(client: reqwest_middleware::ClientWithMiddleware) -> GetSender {
    Arc::new(move |url, cut| {
        let client = client.clone();
        Box::pin(async move {
            let mut req = client.get(url);
            if let Some(cut) = cut {
                req = req.header("x-cut-first", cut);
            }
            req.send().await.ok()?.bytes().await.ok()
        })
    })
}

/// Cut reads recovered (the caller got the whole body), of those cut.
pub(crate) async fn cut_reads(send: GetSender) -> usize {
    let mut recovered = 0;
    for size in [16 * 1024, 1024 * 1024] {
        let body: Bytes = (0..size)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<u8>>()
            .into();
        let options = cut_server::Options::new(body.clone());
        let server = cut_server::CutServer::start(options, Vec::new()).await;
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..CUT_OPS_PER_SIZE {
            // A quarter cut right after the head, a quarter half-way, half whole.
            let cut = match i % 4 {
                0 => Some(0),
                1 => Some(size / 2),
                _ => None,
            };
            let url = server.url(&format!("/files/{i}"));
            let send = send.clone();
            tasks.spawn(async move { (cut.is_some(), send(url, cut).await) });
        }
        while let Some(done) = tasks.join_next().await {
            if let (true, Some(got)) = done.expect("no panic") {
                recovered += usize::from(got == body);
            }
        }
    }
    recovered
}
