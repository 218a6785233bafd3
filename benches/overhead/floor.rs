//! The floor: the least any layer meeting this crate's contract must do per request.

use std::convert::Infallible;
use std::hint::black_box;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use tower::retry::budget::Budget;
use tower::retry::Policy;
use tower::Service;
use tower_retry_safety::budget::LockFreeBudget;
use tower_retry_safety::RetryReport;

use super::Res;
use retry_safety_testing::bench::{CloneNeverRetry, Req};

/// The least any layer meeting this crate's contract must add to `tower::retry`'s clone: the
/// attempt marker in the request's extensions (so an inner retry layer never compounds), a
/// report-sized value in the response's extensions (every response carries a `RetryReport`),
/// a deposit in the default budget (`LockFreeBudget`), and the clock read behind the first
/// attempt's time. No classification, no decision: a lower bound, not an alternative.
#[derive(Clone)]
pub(crate) struct Floor<S> {
    inner: S,
    budget: Arc<LockFreeBudget>,
}

#[derive(Clone)]
struct FloorMarker;

#[derive(Clone)]
#[allow(dead_code)] // only its size matters
struct FloorReport([u8; std::mem::size_of::<RetryReport>()]);

impl<S> Service<Req> for Floor<S>
where
    S: Service<Req, Response = Res>,
{
    type Response = Res;
    type Error = S::Error;
    type Future = FloorFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        self.budget.deposit();
        let started = SystemTime::now();
        let copy = Policy::<Req, Res, Infallible>::clone_request(&mut CloneNeverRetry, &req);
        req.extensions_mut().insert(FloorMarker);
        FloorFuture {
            future: self.inner.call(req),
            copy,
            started,
        }
    }
}

pin_project_lite::pin_project! {
    pub(crate) struct FloorFuture<F> {
        #[pin]
        future: F,
        copy: Option<Req>,
        started: SystemTime,
    }
}

impl<F, E> std::future::Future for FloorFuture<F>
where
    F: std::future::Future<Output = Result<Res, E>>,
{
    type Output = Result<Res, E>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut res = std::task::ready!(this.future.poll(cx))?;
        black_box(this.started);
        this.copy.take();
        res.extensions_mut()
            .insert(FloorReport([0; std::mem::size_of::<RetryReport>()]));
        Poll::Ready(Ok(res))
    }
}

impl<S> Floor<S> {
    /// Over `inner`, with a default budget of its own.
    pub(crate) fn new(inner: S) -> Self {
        Floor {
            inner,
            budget: Arc::new(LockFreeBudget::default()),
        }
    }
}
