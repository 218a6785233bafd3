use std::error::Error as StdError;
use std::io;
use std::time::Duration;

/// What is known about a failed (or finished) attempt.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailureClass {
    /// The request provably never reached the server's application: connect refused, DNS or
    /// TLS failure, connect timeout, a request canceled before it was written, an HTTP/2
    /// `REFUSED_STREAM`, a request tower's `load_shed` or `buffer` refused without calling the
    /// service below. Retrying cannot repeat a side effect.
    NotSent,
    /// The request may have been applied: a timeout after it was sent, a reset or EOF before
    /// the full response, an HTTP/2 `GOAWAY` (hyper can report one for a request it already
    /// wrote), or any error this crate does not recognise.
    Ambiguous,
    /// The server answered with a transient status (408, 429, 5xx by default) or asked for a
    /// retry with `x-should-retry: true`. The request may have been applied.
    RetryableResponse,
    /// Nothing to gain from repeating: a success, any other status, an error the caller made
    /// building the request.
    Final,
}

impl FailureClass {
    /// A short lowercase name, for logs and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::NotSent => "not-sent",
            FailureClass::Ambiguous => "ambiguous",
            FailureClass::RetryableResponse => "retryable-response",
            FailureClass::Final => "final",
        }
    }
}

/// A [`FailureClass`] with what the server said about when to retry.
///
/// Errors classify to a bare class (see [`classify_error`]); responses may carry a delay from
/// `Retry-After` or `retry-after-ms` (see
/// [`RetryPolicy::classify_response`](crate::policy::RetryPolicy::classify_response)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Classification {
    class: FailureClass,
    retry_after: Option<Duration>,
    retry_after_too_long: bool,
    stored_response: bool,
}

impl Classification {
    pub(crate) fn with_retry_after(class: FailureClass, retry_after: Option<Duration>) -> Self {
        Classification {
            class,
            retry_after,
            retry_after_too_long: false,
            stored_response: false,
        }
    }

    /// A response the server marked as its stored response to an earlier request
    /// with the same idempotency key: it is final, since a repeat gets the same answer.
    pub(crate) fn stored_response() -> Self {
        Classification {
            class: FailureClass::Final,
            retry_after: None,
            retry_after_too_long: false,
            stored_response: true,
        }
    }

    /// A response of `class` (not sent, or retryable) whose server hint asks for a longer
    /// wait than the policy's `max_retry_after`: it is not retried, and keeps its class, which
    /// says whether the request was applied (a refusal that proves nothing ran stays not sent).
    pub(crate) fn retry_after_too_long(class: FailureClass, delay: Duration) -> Self {
        Classification {
            class,
            retry_after: Some(delay),
            retry_after_too_long: true,
            stored_response: false,
        }
    }

    /// The class of the attempt.
    pub fn class(&self) -> FailureClass {
        self.class
    }

    /// The delay the server asked for, if it gave a readable one. It is not capped here:
    /// a delay above the policy's cap ends the retries (see
    /// [`is_retry_after_too_long`](Self::is_retry_after_too_long)).
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// True when the response would be retried but its Retry-After hint exceeds the policy's
    /// `max_retry_after`: no retry follows. The class stays what the status says
    /// ([`NotSent`](FailureClass::NotSent) for a status that proves nothing was applied,
    /// [`RetryableResponse`](FailureClass::RetryableResponse) otherwise), so whether the
    /// request may have been applied does not depend on the wait asked for.
    pub fn is_retry_after_too_long(&self) -> bool {
        self.retry_after_too_long
    }

    /// True when the response is the server's stored response to an earlier
    /// request with the same idempotency key (the policy's
    /// [`stored_response_header`](crate::RetryPolicyBuilder::stored_response_header) says `true`), which made it
    /// final: the server already ran the request once, and a repeat with the same key gets the
    /// same answer, whatever its status.
    pub fn is_stored_response(&self) -> bool {
        self.stored_response
    }
}

impl From<FailureClass> for Classification {
    fn from(class: FailureClass) -> Self {
        Classification::with_retry_after(class, None)
    }
}

/// Classifies an error by walking its `source()` chain down to the concrete types this crate
/// knows: tower's `Elapsed`, `Overloaded`, buffer and `Optional` errors, hyper-util's client
/// error, `hyper::Error`, `h2::Error` (feature `h2`), `std::io::Error`, `reqwest::Error`
/// (feature `reqwest-middleware`). A front end reads its own stack's errors first (see
/// [`StackErrors`]): tonic's `ConnectError` and `TimeoutExpired` through
/// `grpc::classify_error` (feature `tonic`).
///
/// The first error in the chain that tells something decides. An error that nothing in the
/// chain explains is [`FailureClass::Ambiguous`]: a write is never assumed not to have happened.
///
/// ```
/// use std::io;
/// use tower_retry_safety::classify::classify_error;
/// use tower_retry_safety::FailureClass;
///
/// let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
/// assert_eq!(classify_error(&refused), FailureClass::NotSent);
///
/// let reset = io::Error::from(io::ErrorKind::ConnectionReset);
/// assert_eq!(classify_error(&reset), FailureClass::Ambiguous);
///
/// let elapsed = tower::timeout::error::Elapsed::new();
/// assert_eq!(classify_error(&elapsed), FailureClass::Ambiguous);
/// ```
pub fn classify_error(err: &(dyn StdError + 'static)) -> FailureClass {
    classify_error_with(err, &StackErrors::NONE)
}

/// [`classify_error`], with the errors only `stack` knows read first at each step of the chain.
pub(crate) fn classify_error_with(
    err: &(dyn StdError + 'static),
    stack: &StackErrors,
) -> FailureClass {
    chain(err)
        .find_map(|e| (stack.class)(e).or_else(|| classify_one(e, stack)))
        .unwrap_or(FailureClass::Ambiguous)
}

/// What a client stack's own error types say, read before the types this crate knows: the
/// hook a front end gives the decision core for errors that only it can name. A request body
/// type brings its stack's ([`ReplayBody::stack_errors`](crate::service::ReplayBody::stack_errors)):
/// tonic's `Body` (feature `tonic`) reads tonic's `ConnectError` as
/// [`FailureClass::NotSent`] and its `TimeoutExpired` as a timeout; every other body reads
/// none ([`StackErrors::NONE`]).
///
/// Made by this crate's front ends only: it has no public constructor.
#[derive(Clone, Copy)]
pub struct StackErrors {
    /// The class one error of the chain tells, if the stack knows it.
    pub(crate) class: fn(&(dyn StdError + 'static)) -> Option<FailureClass>,
    /// Whether one error of the chain is the stack's timeout.
    pub(crate) timed_out: fn(&(dyn StdError + 'static)) -> bool,
    /// Whether the stack names any error of its own (`false` only for [`StackErrors::NONE`]).
    pub(crate) reads: bool,
    /// The client below the layer sends every request to its own endpoint, whatever the
    /// request's URI names (tonic's `Channel` replaces the scheme and authority): the URI
    /// does not say where a request goes.
    pub(crate) rewrites_authority: bool,
}

impl StackErrors {
    /// No errors of a stack's own: the chain is read with the types this crate knows.
    pub const NONE: StackErrors = StackErrors {
        class: |_| None,
        timed_out: |_| false,
        reads: false,
        rewrites_authority: false,
    };

    /// Whether the stack names errors of its own: a body type that wraps two others
    /// forwards the one that does.
    pub fn reads_errors(&self) -> bool {
        self.reads
    }
}

impl std::fmt::Debug for StackErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StackErrors").finish_non_exhaustive()
    }
}

/// `err` and its `source()`s, outermost first. Chains are short; the bound only guards
/// against a cyclic `source()`.
pub(crate) fn chain<'a>(
    err: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    std::iter::successors(Some(err), |&e| e.source()).take(32)
}

/// What one error in the chain tells, if anything. `None` means: look at its source.
fn classify_one(err: &(dyn StdError + 'static), stack: &StackErrors) -> Option<FailureClass> {
    if err.is::<tower::timeout::error::Elapsed>() {
        // A per-attempt timeout fires whether or not the server got the request.
        return Some(FailureClass::Ambiguous);
    }
    if let Some(class) = tower_class(err) {
        return Some(class);
    }
    if let Some(err) = err.downcast_ref::<hyper_util::client::legacy::Error>() {
        return hyper_util_class(err);
    }
    if let Some(err) = err.downcast_ref::<hyper::Error>() {
        return hyper_class(err);
    }
    #[cfg(feature = "h2")]
    if let Some(err) = err.downcast_ref::<h2::Error>() {
        return h2_class(err, stack);
    }
    #[cfg(feature = "reqwest-middleware")]
    if let Some(err) = err.downcast_ref::<reqwest::Error>() {
        return reqwest_class(err);
    }
    if let Some(err) = err.downcast_ref::<io::Error>() {
        return io_class(err, stack);
    }
    None
}

/// tower's own errors, each returned in place of calling the service below, or not.
fn tower_class(err: &(dyn StdError + 'static)) -> Option<FailureClass> {
    use tower::buffer::error::{Closed, ServiceError};
    // `LoadShed::call` returns `Overloaded` instead of calling the inner service when it was
    // not ready; `Optional::call` returns `None` when there is no inner service.
    if err.is::<tower::load_shed::error::Overloaded>()
        || err.is::<tower::util::error::optional::None>()
    {
        return Some(FailureClass::NotSent);
    }
    // The buffer's worker makes a `ServiceError` only when the inner `poll_ready` failed, and
    // then hands it to requests instead of calling the inner service; errors of a called
    // request pass through unwrapped. The check comes before its source (the readiness error).
    if err.is::<ServiceError>() {
        return Some(FailureClass::NotSent);
    }
    // `Closed` also reaches a request whose inner `call` panicked in the worker.
    if err.is::<Closed>() {
        return Some(FailureClass::Ambiguous);
    }
    None
}

fn hyper_util_class(err: &hyper_util::client::legacy::Error) -> Option<FailureClass> {
    if err.is_connect() {
        // The connector failed, or the pool checkout did: no connection carried the request.
        return Some(FailureClass::NotSent);
    }
    // hyper-util exposes no predicate for its other kinds; its Display is
    // "client error (Kind)". The tests in this crate pin these strings.
    let shown = err.to_string();
    let kind = shown
        .strip_prefix("client error (")
        .and_then(|s| s.strip_suffix(')'))
        .unwrap_or("");
    match kind {
        // Returned before anything was written: a checkout that lost a race, or a request
        // given back unsent by the connection (its source, a canceled hyper::Error, agrees).
        "Canceled" => Some(FailureClass::NotSent),
        // The caller built a request this client cannot send; repeating cannot help.
        "UserUnsupportedRequestMethod" | "UserUnsupportedVersion" | "UserAbsoluteUriRequired" => {
            Some(FailureClass::Final)
        }
        // SendRequest is both a failed handshake (nothing sent) and a request hyper did not
        // give back (maybe written); ChannelClosed comes only from the pool's idle check. These
        // and anything new: the source decides.
        _ => None,
    }
}

fn hyper_class(err: &hyper::Error) -> Option<FailureClass> {
    if err.is_canceled() {
        // "A pending item was dropped before ever being processed."
        return Some(FailureClass::NotSent);
    }
    if err.is_incomplete_message() || err.is_body_write_aborted() || err.is_timeout() {
        return Some(FailureClass::Ambiguous);
    }
    // Io, Http2 and the rest: a deeper source may know more (an io kind, an h2 reason).
    None
}

#[cfg(feature = "h2")]
fn h2_class(err: &h2::Error, stack: &StackErrors) -> Option<FailureClass> {
    if err.is_remote() && (err.reason() == Some(h2::Reason::REFUSED_STREAM)) {
        // RFC 9113 §8.7: REFUSED_STREAM means the stream was not processed at all.
        return Some(FailureClass::NotSent);
    }
    if err.is_remote() && err.is_go_away() {
        // Not proof of "not sent". h2 fails the streams above the frame's last-stream-id with
        // it (Streams::recv_go_away), but it also stays the connection's error, and hyper's
        // ClientTask::poll hands it, with no request back, to a request whose HEADERS
        // send_request had already queued (its poll_ready after send_request). Both arrive as
        // the same hyper::Error. hyper hands a request back unsent only as canceled.
        return Some(FailureClass::Ambiguous);
    }
    if let Some(io) = err.get_io() {
        return io_class(io, stack);
    }
    Some(FailureClass::Ambiguous)
}

#[cfg(feature = "reqwest-middleware")]
fn reqwest_class(err: &reqwest::Error) -> Option<FailureClass> {
    if err.is_builder() {
        return Some(FailureClass::Final);
    }
    if err.is_connect() {
        // Includes connect timeouts: reqwest marks them as both.
        return Some(FailureClass::NotSent);
    }
    if err.is_timeout() {
        return Some(FailureClass::Ambiguous);
    }
    // Request, body and decode errors: the wrapped hyper-util / hyper error decides.
    None
}

/// `stack` reads a custom payload as it reads the chain: tonic's error wrapped in an
/// `io::Error` is still tonic's.
fn io_class(err: &io::Error, stack: &StackErrors) -> Option<FailureClass> {
    use io::ErrorKind::*;
    match err.kind() {
        ConnectionRefused => Some(FailureClass::NotSent),
        ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof | TimedOut => {
            Some(FailureClass::Ambiguous)
        }
        // `io::Error::source` skips a custom payload's own type; look at it directly.
        _ => err.get_ref().and_then(|inner| {
            let inner: &(dyn StdError + 'static) = inner;
            match classify_error_with(inner, stack) {
                FailureClass::Ambiguous => None,
                class => Some(class),
            }
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt;

    #[derive(Debug)]
    struct Wrap(Box<dyn StdError + Send + Sync>);
    impl fmt::Display for Wrap {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("wrapper")
        }
    }
    impl StdError for Wrap {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&*self.0)
        }
    }

    #[derive(Debug)]
    struct Unknown;
    impl fmt::Display for Unknown {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("unknown")
        }
    }
    impl StdError for Unknown {}

    #[test]
    fn io_kinds() {
        use io::ErrorKind::*;
        let cases = [
            (ConnectionRefused, FailureClass::NotSent),
            (ConnectionReset, FailureClass::Ambiguous),
            (ConnectionAborted, FailureClass::Ambiguous),
            (BrokenPipe, FailureClass::Ambiguous),
            (UnexpectedEof, FailureClass::Ambiguous),
            (TimedOut, FailureClass::Ambiguous),
            (Other, FailureClass::Ambiguous),
        ];
        for (kind, class) in cases {
            assert_eq!(classify_error(&io::Error::from(kind)), class, "{kind:?}");
        }
    }

    #[test]
    fn walks_the_source_chain() {
        let deep = Wrap(Box::new(Wrap(Box::new(io::Error::from(
            io::ErrorKind::ConnectionRefused,
        )))));
        assert_eq!(classify_error(&deep), FailureClass::NotSent);
    }

    #[test]
    fn io_custom_payload_is_inspected() {
        let inner = io::Error::other(Wrap(Box::new(io::Error::from(
            io::ErrorKind::ConnectionRefused,
        ))));
        assert_eq!(classify_error(&inner), FailureClass::NotSent);
    }

    #[test]
    fn unknown_errors_are_ambiguous() {
        assert_eq!(classify_error(&Unknown), FailureClass::Ambiguous);
        assert_eq!(
            classify_error(&Wrap(Box::new(Unknown))),
            FailureClass::Ambiguous
        );
    }

    #[test]
    fn tower_elapsed_is_ambiguous_even_when_wrapped() {
        let e = Wrap(Box::new(tower::timeout::error::Elapsed::new()));
        assert_eq!(classify_error(&e), FailureClass::Ambiguous);
    }

    #[cfg(feature = "h2")]
    #[test]
    fn h2_reasons() {
        // h2 lets us build only locally initiated errors from a reason: those stay ambiguous.
        let local: h2::Error = h2::Reason::REFUSED_STREAM.into();
        assert!(!local.is_remote());
        assert_eq!(classify_error(&local), FailureClass::Ambiguous);
        let other: h2::Error = h2::Reason::INTERNAL_ERROR.into();
        assert_eq!(classify_error(&other), FailureClass::Ambiguous);
    }
}
