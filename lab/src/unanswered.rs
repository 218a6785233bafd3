//! How a request ends without an answer: the proxy's handler decides, and whichever server
//! speaks to the client (hyper for HTTP/1.1, [`h2_serve`](super::h2_serve)) carries it out.

/// How a request ends without an answer.
#[derive(Debug)]
pub(crate) enum Unanswered {
    /// HTTP/1.1: the connection is closed. HTTP/2: the stream is reset with the reason
    /// (`INTERNAL_ERROR` when none).
    Dropped(Option<h2::Reason>),
    /// HTTP/2 only: the connection went away (a GOAWAY fault); nothing more is sent on the
    /// stream, and the connection closes.
    GoneAway,
}

pub(crate) const DROPPED: Unanswered = Unanswered::Dropped(None);
/// Not processed (RFC 9113 §8.7): a client may send it again.
pub(crate) const REFUSED: Unanswered = Unanswered::Dropped(Some(h2::Reason::REFUSED_STREAM));
