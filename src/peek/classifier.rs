use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::{HeaderMap, StatusCode};
use http_body::Body;
use http_body_util::BodyExt;

use super::PeekedBody;
use crate::FailureClass;

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

    /// Whether to read this response's body. By default only a body that declares a length
    /// within the limit is read: waiting on a stream (server-sent events) could wait forever.
    pub(crate) fn wants(&self, status: StatusCode, headers: &HeaderMap) -> bool {
        match &self.when {
            Some(when) => when(status, headers),
            None => headers
                .get(CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                .is_some_and(|len| len <= self.limit as u64),
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
        let mut read = PeekedBody::empty();
        let mut len = 0usize;
        loop {
            match body.frame().await {
                Some(Ok(frame)) => match frame.into_data() {
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
                None => break,
            }
        }
        let class = read.with_bytes(|bytes| (self.classify)(status, headers, bytes));
        (read, class)
    }
}
