//! Bodies read into memory: a keyed request's, for its fingerprint, and a keyed response's, to
//! store it (or as much of it as fits, handed on with the rest still streaming).

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::Body;
use http_body_util::BodyExt;

use tower_retry_safety::BoxError;

pub(crate) enum ReadError {
    TooLarge,
    Failed,
}

/// A request body, read whole up to `limit` bytes (trailers are not part of it).
pub(crate) async fn read_body<B>(body: B, limit: usize) -> Result<Bytes, ReadError>
where
    B: Body<Data = Bytes>,
{
    if body.size_hint().lower() > limit as u64 {
        return Err(ReadError::TooLarge);
    }
    let mut body = std::pin::pin!(body);
    let mut data = Chunks::default();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return Err(ReadError::Failed);
        };
        if let Ok(chunk) = frame.into_data() {
            data.push(chunk);
            if data.len() > limit {
                return Err(ReadError::TooLarge);
            }
        }
    }
    Ok(data.into_bytes())
}

/// The chunks of a body read so far. Most bodies come in one chunk, kept as it is (no copy,
/// no allocation); later chunks are joined into one buffer.
#[derive(Default)]
pub(crate) struct Chunks {
    first: Bytes,
    joined: BytesMut,
}

impl Chunks {
    pub(crate) fn push(&mut self, chunk: Bytes) {
        if self.first.is_empty() && self.joined.is_empty() {
            self.first = chunk;
            return;
        }
        if !self.first.is_empty() {
            let first = std::mem::take(&mut self.first);
            self.joined.reserve(first.len() + chunk.len());
            self.joined.extend_from_slice(&first);
        }
        self.joined.extend_from_slice(&chunk);
    }

    pub(crate) fn len(&self) -> usize {
        self.first.len() + self.joined.len()
    }

    pub(crate) fn into_bytes(self) -> Bytes {
        if self.joined.is_empty() {
            self.first
        } else {
            self.joined.freeze()
        }
    }
}

pub(crate) enum Buffered<B> {
    /// The whole body, and its trailers if it ended with them (a gRPC response's status).
    Whole(Bytes, Option<HeaderMap>),
    /// Not stored: too large, data after its trailers, or failed mid-way. Carries what was read, and the
    /// error that stopped the reading (the client must get it, not a clean end).
    Partial {
        prefix: Bytes,
        trailers: Option<HeaderMap>,
        error: Option<BoxError>,
        rest: B,
        why: &'static str,
    },
}

pub(crate) async fn buffer<B>(mut body: B, limit: usize) -> Buffered<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut data = Chunks::default();
    // The frame that ended the data: trailers, or another kind (the result is not held
    // across the next await: the body's error type need not be `Send`).
    let trailers = loop {
        match body.frame().await {
            None => return Buffered::Whole(data.into_bytes(), None),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(chunk) => {
                    data.push(chunk);
                    if data.len() > limit {
                        return Buffered::Partial {
                            prefix: data.into_bytes(),
                            trailers: None,
                            error: None,
                            rest: body,
                            why: "over the size limit",
                        };
                    }
                }
                Err(frame) => break frame.into_trailers().ok(),
            },
            Some(Err(err)) => {
                return Buffered::Partial {
                    prefix: data.into_bytes(),
                    trailers: None,
                    error: Some(err.into()),
                    rest: body,
                    why: "its body failed",
                }
            }
        }
    };
    // Trailers end a body (a gRPC status lives there): kept with it when nothing follows
    // them. A frame after them breaks the body's contract.
    let error: Option<BoxError> = match trailers {
        Some(_) => match body.frame().await {
            None => return Buffered::Whole(data.into_bytes(), trailers),
            Some(Ok(_)) => Some("the response body went on after its trailers".into()),
            Some(Err(err)) => Some(err.into()),
        },
        None => None,
    };
    Buffered::Partial {
        prefix: data.into_bytes(),
        trailers,
        error,
        rest: body,
        why: "it is not a body ended by its trailers",
    }
}
