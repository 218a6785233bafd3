//! The note an answer carries on the deadline headers the layer did not use as sent.

use http::{HeaderName, HeaderValue, Response};
use tower_retry_safety::deadline::BadDeadline;

/// The answer's header that says what became of a request's deadline or attempt headers,
/// when one was not used as sent: `capped` (the earliest deadline was over the server's
/// maximum), `ignored-malformed`, `ignored-too-long` (the server's maximum applied instead).
/// A note on the server's own header
/// ([`timeout_header`](super::DeadlineLayer::timeout_header)) is the bare value; a note on
/// any other names it, `ignored-malformed; x-stainless-read-timeout`. One field line per note.
pub const DEADLINE_NOTE: HeaderName = HeaderName::from_static("request-timeout-note");

/// What became of one header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Note {
    Capped,
    Malformed,
    TooLong,
}

impl Note {
    fn as_str(self) -> &'static str {
        match self {
            Note::Capped => "capped",
            Note::Malformed => "ignored-malformed",
            Note::TooLong => "ignored-too-long",
        }
    }
}

impl From<BadDeadline> for Note {
    fn from(bad: BadDeadline) -> Self {
        match bad {
            BadDeadline::TooLong => Note::TooLong,
            _ => Note::Malformed,
        }
    }
}

/// The notes on one request: empty, and unallocated, when every header named was used.
#[derive(Debug, Default)]
pub(crate) struct Notes(Vec<HeaderValue>);

/// The most notes an answer carries: one per header read, at most.
const MAX_NOTES: usize = 16;

impl Notes {
    /// A note on the server's own deadline header: the bare value.
    pub(crate) fn own(&mut self, note: Note) {
        self.push(HeaderValue::from_static(note.as_str()));
    }

    /// Kept once each, and at most [`MAX_NOTES`]: a caller that repeats a bad header a
    /// thousand times gets one note, not a thousand.
    fn push(&mut self, value: HeaderValue) {
        if self.0.len() < MAX_NOTES && !self.0.contains(&value) {
            self.0.push(value);
        }
    }

    /// A note on `header`, named in the value.
    #[cold]
    pub(crate) fn on(&mut self, note: Note, header: &HeaderName) {
        // A header name is a valid field value; a refusal would only lose the note.
        if self.0.len() >= MAX_NOTES {
            return;
        }
        if let Ok(value) = HeaderValue::try_from(format!("{}; {header}", note.as_str())) {
            self.push(value);
        }
    }

    /// Writes the notes on `res`.
    pub(crate) fn mark<B>(self, res: &mut Response<B>) {
        for value in self.0 {
            res.headers_mut().append(DEADLINE_NOTE, value);
        }
    }
}
