//! Property test of bodies cut mid-way: for any cut points over up to 4 responses, any body
//! length around the read-whole limit, a server with or without ranges, a superset, and an
//! ETag that may change, the caller's bytes are the original body, or a prefix of it followed
//! by a `BodyCutError`: two representations are never spliced (within the limit, a body read
//! again whole may be a newer representation, never delivered in part before). Where recovery is possible
//! (ranges, a stable ETag, no more cuts than retries) it always happens.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use proptest::prelude::*;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_retry_safety::resume::{BodyCutError, ReadWholeLayer};
use tower_retry_safety::RetryPolicy;

const LIMIT: u64 = 1024;
const MAX_RETRIES: u32 = 3;

/// Version `v` of the representation: different bytes for each version, so a splice shows.
fn representation(len: usize, v: u32) -> Bytes {
    (0..len)
        .map(|i| ((i * 7 + v as usize * 13) % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// A body of a known length, sent in frames, cut after `cut` bytes if it has one.
struct Piece {
    data: Bytes,
    sent: usize,
    cut: Option<usize>,
    frame: usize,
}

impl Body for Piece {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let end = self.cut.unwrap_or(self.data.len()).min(self.data.len());
        if self.sent < end {
            let upto = (self.sent + self.frame).min(end);
            let chunk = self.data.slice(self.sent..upto);
            self.sent = upto;
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if self.cut.is_some() && self.sent < self.data.len() {
            self.cut = None;
            self.sent = self.data.len();
            return Poll::Ready(Some(Err(io::Error::other("cut"))));
        }
        Poll::Ready(None)
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact((self.data.len() - self.sent) as u64)
    }
}

#[derive(Clone, Debug)]
struct Case {
    len: usize,
    /// Each response's cut, as a fraction (per mille) of its body; `None`: whole.
    cuts: Vec<Option<u16>>,
    ranges: bool,
    superset: usize,
    /// The response from which the ETag changes, if it does.
    etag_changes_at: Option<usize>,
    frame: usize,
}

fn case() -> impl Strategy<Value = Case> {
    (
        0usize..4 * LIMIT as usize,
        prop::collection::vec(prop::option::of(0u16..=1000), 0..=4),
        any::<bool>(),
        prop_oneof![Just(0usize), 1usize..300],
        prop::option::of(1usize..4),
        1usize..700,
    )
        .prop_map(
            |(len, cuts, ranges, superset, etag_changes_at, frame)| Case {
                len,
                cuts,
                ranges,
                superset,
                etag_changes_at,
                frame,
            },
        )
}

struct Server {
    case: Case,
    plan: VecDeque<Option<u16>>,
    responses: usize,
}

fn respond(server: &Mutex<Server>, req: &Request<Full<Bytes>>) -> Response<Piece> {
    let mut server = server.lock().unwrap();
    let n = server.responses;
    server.responses += 1;
    let cut = server.plan.pop_front().flatten();
    let case = &server.case;
    let version = match case.etag_changes_at {
        Some(at) if n >= at => 2,
        _ => 1,
    };
    let body = representation(case.len, version);
    let etag = format!("\"v{version}\"");
    let range = req.headers().get(header::RANGE).and_then(|v| {
        v.to_str()
            .ok()?
            .strip_prefix("bytes=")?
            .strip_suffix('-')?
            .parse::<usize>()
            .ok()
    });
    let if_range_ok = req
        .headers()
        .get(header::IF_RANGE)
        .is_none_or(|v| v.as_bytes() == etag.as_bytes());
    let mut res = Response::builder().header(header::ETAG, etag);
    let data = match range {
        Some(start) if case.ranges && if_range_ok && start < body.len() => {
            let from = start.saturating_sub(case.superset);
            res = res.status(StatusCode::PARTIAL_CONTENT).header(
                header::CONTENT_RANGE,
                format!("bytes {from}-{}/{}", body.len() - 1, body.len()),
            );
            body.slice(from..)
        }
        _ => body,
    };
    let cut = cut.map(|per_mille| data.len() * per_mille as usize / 1000);
    res.body(Piece {
        data,
        sent: 0,
        cut,
        frame: case.frame,
    })
    .unwrap()
}

/// The caller's bytes, and the error that ended them if one did.
fn run(case: &Case) -> (Vec<u8>, Option<BoxError>) {
    let server = Arc::new(Mutex::new(Server {
        case: case.clone(),
        plan: case.cuts.iter().copied().collect(),
        responses: 0,
    }));
    let inner = tower::service_fn(move |req: Request<Full<Bytes>>| {
        let res = respond(&server, &req);
        async move { Ok::<_, BoxError>(res) }
    });
    let policy = RetryPolicy::builder()
        .max_retries(MAX_RETRIES)
        .backoff(Duration::from_millis(1), Duration::from_millis(10))
        .no_budget()
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(policy)
        .layer(ReadWholeLayer::new().limit(LIMIT))
        .service(inner);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async move {
        let req = Request::get("http://example.com/file")
            .body(Full::default())
            .unwrap();
        let res = svc.oneshot(req).await.expect("a response");
        let mut body = res.into_body();
        let mut bytes = Vec::new();
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => {
                    if let Some(data) = frame.data_ref() {
                        bytes.extend_from_slice(data);
                    }
                }
                Err(err) => return (bytes, Some(err)),
            }
        }
        (bytes, None)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn caller_bytes_are_the_body_or_a_prefix_and_an_error(case in case()) {
        let original = representation(case.len, 1);
        // Within the limit, a body read again after the representation changed is the new one,
        // whole: the first was never delivered. Past it, only the first is ever delivered.
        let within = case.len as u64 <= LIMIT;
        let changed = representation(case.len, 2);
        let (bytes, err) = run(&case);
        match err {
            None => prop_assert!(
                bytes == original || (within && bytes == changed),
                "whole, but not one representation"
            ),
            Some(err) => {
                prop_assert!(err.downcast_ref::<BodyCutError>().is_some(), "{err:?}");
                prop_assert!(bytes.len() <= original.len());
                let prefix_of = |of: &Bytes| bytes[..] == of[..bytes.len()];
                prop_assert!(prefix_of(&original) || (within && prefix_of(&changed)), "spliced");
            }
        }
        // Recovery is possible: the same representation all along, ranges past the limit,
        // and no more cuts than retries.
        let cuts = case.cuts.iter().filter(|c| c.is_some()).count() as u32;
        let past_limit = case.len as u64 > LIMIT;
        let recoverable = case.etag_changes_at.is_none()
            && (case.ranges || !past_limit)
            && cuts <= MAX_RETRIES;
        if recoverable {
            let (bytes, err) = run(&case);
            prop_assert!(err.is_none(), "not recovered: {err:?}");
            prop_assert!(bytes == original);
        }
    }
}
