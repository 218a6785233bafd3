use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body::Body;
use http_body_util::BodyExt;

use super::PeekedBody;
use crate::classify::FailureClass;

/// The most frames read from one body: bounds the time and memory that a body of many empty
/// or tiny frames can take before it is handed on.
const MAX_FRAMES: usize = 1024;

type ClassifyFn = dyn Fn(StatusCode, &HeaderMap, &[u8]) -> Option<FailureClass> + Send + Sync;
type WhenFn = dyn Fn(StatusCode, &HeaderMap) -> bool + Send + Sync;

/// What reads a response body and classifies it, shared by the tower layer and the
/// reqwest-middleware one.
#[derive(Clone)]
pub(crate) struct Classifier {
    limit: usize,
    classify: Arc<ClassifyFn>,
    when: Option<Arc<WhenFn>>,
}

impl fmt::Debug for Classifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Classifier")
            .field("limit", &self.limit)
            .field("when", &self.when.as_ref().map(|_| "set"))
            .finish_non_exhaustive()
    }
}

impl Classifier {
    pub(crate) fn new<F>(limit: usize, classify: F) -> Self
    where
        F: Fn(StatusCode, &HeaderMap, &[u8]) -> Option<FailureClass> + Send + Sync + 'static,
    {
        Classifier {
            limit,
            classify: Arc::new(classify),
            when: None,
        }
    }

    pub(crate) fn when<F>(mut self, when: F) -> Self
    where
        F: Fn(StatusCode, &HeaderMap) -> bool + Send + Sync + 'static,
    {
        self.when = Some(Arc::new(when));
        self
    }

    /// Whether to read this response's body, whose exact length (as the transport knows it,
    /// from its size hint) is `exact_len`. By default only a body of a known length within the
    /// limit is read: waiting on a stream (server-sent events) could wait forever. The length
    /// is the transport's, not the content-length header's: a chunked body that also sends
    /// the header has none.
    pub(crate) fn wants(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        exact_len: Option<u64>,
    ) -> bool {
        match &self.when {
            Some(when) => when(status, headers),
            None => exact_len.is_some_and(|len| len <= self.limit as u64),
        }
    }

    /// Reads up to the limit of `body` and classifies it if it ended within the limit. The
    /// body handed on sends what was read, then the rest.
    pub(crate) async fn read<B>(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        mut body: B,
    ) -> (PeekedBody<B>, Option<FailureClass>)
    where
        B: Body<Data = Bytes> + Unpin,
    {
        let mut read = PeekedBody::empty(body.size_hint().exact().is_some());
        let mut len = 0usize;
        for _ in 0..MAX_FRAMES {
            match body.frame().await {
                Some(Ok(frame)) => match frame.into_data() {
                    // Nothing to keep: an empty chunk sends nothing.
                    Ok(chunk) if chunk.is_empty() => {}
                    Ok(chunk) => {
                        len += chunk.len();
                        read.push_data(chunk);
                        if len > self.limit {
                            // Too long to classify: hand it on as it is.
                            return (read.then(body), None);
                        }
                    }
                    Err(frame) => {
                        if let Ok(trailers) = frame.into_trailers() {
                            read.set_trailers(trailers);
                        }
                    }
                },
                Some(Err(err)) => return (read.then_fail(err), None),
                None => {
                    let class = read.with_bytes(|bytes| (self.classify)(status, headers, bytes));
                    return (read, class);
                }
            }
        }
        // Cut in more frames than a body worth classifying has (empty ones, say, which count
        // no bytes): hand it on unread from here, so the reading ends and memory stays bounded.
        (read.then(body), None)
    }
}
