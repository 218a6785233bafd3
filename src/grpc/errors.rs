//! tonic's own errors, which only this front end can name: the hook it gives the decision
//! core through tonic's request body.

use std::error::Error as StdError;

use crate::classify::{FailureClass, StackErrors};

/// tonic's `Channel`: its connector failed, so no connection carried the call (not sent); or
/// the call's `grpc-timeout` ran out, whether or not the server had it (a timeout, ambiguous).
/// And it sends every call to its endpoint, whatever authority the call's URI names.
pub(crate) const TONIC: StackErrors = StackErrors {
    class: |err| {
        if err.is::<tonic::ConnectError>() {
            return Some(FailureClass::NotSent);
        }
        if err.is::<tonic::TimeoutExpired>() {
            return Some(FailureClass::Ambiguous);
        }
        None
    },
    timed_out: |err| err.is::<tonic::TimeoutExpired>(),
    reads: true,
    // The `Channel` sends each call to its endpoint: a generated client's `with_origin`
    // authority in the URI decides nothing.
    rewrites_authority: true,
};

/// [`classify_error`](crate::classify::classify_error), reading tonic's own errors too: a
/// `tonic::ConnectError` is [`FailureClass::NotSent`] (its connector failed: no connection
/// carried the call) whatever its source says, a `tonic::TimeoutExpired` ambiguous. The layer
/// on a `Channel` reads them so already (tonic's `Body` brings them).
///
/// ```
/// use tower_retry_safety::{classify, grpc, FailureClass};
///
/// let connect = tonic::ConnectError(Box::new(std::io::Error::other("no route")));
/// assert_eq!(grpc::classify_error_with_tonic(&connect), FailureClass::NotSent);
/// // Without tonic's errors, the same error says nothing this crate knows.
/// assert_eq!(classify::classify_error(&connect), FailureClass::Ambiguous);
/// ```
pub fn classify_error_with_tonic(err: &(dyn StdError + 'static)) -> FailureClass {
    crate::classify::classify_error_with(err, &TONIC)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::Symptom;

    #[test]
    fn tonics_connect_error_is_not_sent_and_its_timeout_ambiguous() {
        // A connector error that says nothing of its own: tonic's wrapper decides.
        let connect = tonic::ConnectError(Box::new(std::io::Error::other("no route")));
        assert_eq!(classify_error_with_tonic(&connect), FailureClass::NotSent);
        let timeout = tonic::TimeoutExpired(());
        assert_eq!(classify_error_with_tonic(&timeout), FailureClass::Ambiguous);
        assert_eq!(Symptom::of(&timeout, &TONIC), Symptom::Timeout);
        // Without tonic's hook, the same errors say nothing this crate knows.
        assert_eq!(
            crate::classify::classify_error(&connect),
            FailureClass::Ambiguous
        );
        assert_eq!(Symptom::of(&timeout, &StackErrors::NONE), Symptom::Other);
    }

    /// tonic's error inside an `io::Error`'s payload is read as tonic's (the payload is
    /// classified with the same hook as the chain). Found by review.
    #[test]
    fn tonics_connect_error_inside_an_io_error_is_still_not_sent() {
        let connect = tonic::ConnectError(Box::new(std::io::Error::other("no route")));
        let wrapped = std::io::Error::other(connect);
        assert_eq!(classify_error_with_tonic(&wrapped), FailureClass::NotSent);
    }

    /// A body that is tonic's on one side of an `Either` brings tonic's errors: the wrapper
    /// forwards the side that names any. Found by review.
    #[test]
    fn an_either_with_tonics_body_forwards_its_errors() {
        use crate::service::ReplayBody;
        use http_body_util::{Either, Full};
        type Left = Either<tonic::body::Body, Full<bytes::Bytes>>;
        type Right = Either<Full<bytes::Bytes>, tonic::body::Body>;
        assert!(Left::stack_errors().reads_errors());
        assert!(Right::stack_errors().reads_errors());
        assert!(!<Full<bytes::Bytes>>::stack_errors().reads_errors());
    }
}
