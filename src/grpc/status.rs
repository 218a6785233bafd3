//! This crate's error as a `tonic::Status`.

use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

use crate::attempts::Error;

use crate::attempts::MayHaveBeenApplied;

/// Metadata key of the attempts made, in a `tonic::Status` made by [`status_of`], and in the
/// status of a call whose last attempt the server answered with a failed `grpc-status`.
pub const ATTEMPTS_KEY: &str = "retry-safety-attempts";
/// Metadata key saying whether the call may have been applied (`true` or `false`), in the
/// same statuses.
pub const MAY_HAVE_BEEN_APPLIED_KEY: &str = "retry-safety-may-have-been-applied";
/// Metadata key of this process's mark beside the layer's answer: a random value made once per
/// process, which a server cannot forge (its own `retry-safety-may-have-been-applied` is then
/// not believed). Not a secret: it only tells this process's answers from others'.
pub const MARK_KEY: &str = "retry-safety-mark";

/// The `tonic::Status` a caller gets for `err`.
///
/// The code says what a caller's own retry loop may do: `UNAVAILABLE` only when no attempt
/// reached the server (a repeat is harmless) and time was left; `DEADLINE_EXCEEDED` when the
/// call timed out after it may have been applied, or its deadline (or its caller's) passed
/// before an attempt could be sent; `UNKNOWN` for any other call that may have been applied,
/// and `INTERNAL` for an error retrying cannot fix. The message is the error's `Display`:
/// the method, whether the call may have been applied and what to check, never a header value
/// or a body byte. The metadata carries [`ATTEMPTS_KEY`] and [`MAY_HAVE_BEEN_APPLIED_KEY`].
///
/// Put `map_err(`[`into_status`]`)` over the layer so that a generated client returns it
/// (tonic would otherwise make its own `Status` from the error, which does not say whether the
/// call may have been applied):
///
/// ```
/// use tower::ServiceBuilder;
/// use tower_retry_safety::{grpc, RetryPolicy};
///
/// # fn demo(channel: tonic::transport::Channel) -> Result<(), Box<dyn std::error::Error>> {
/// let svc = ServiceBuilder::new()
///     .map_err(grpc::into_status)
///     .layer(RetryPolicy::builder().build()?)
///     .service(channel);
/// # let _ = svc; Ok(()) }
/// ```
pub fn status_of(err: &Error) -> Status {
    let code = if !err.is_ambiguous() {
        // Nothing reached the server (or the service failed before any attempt).
        if matches!(
            err.stop_reason(),
            crate::policy::StopReason::CallerDeadline | crate::policy::StopReason::Deadline
        ) {
            // The deadline passed before an attempt could be sent: what gRPC says of a call
            // past its deadline, and a code retry policies do not retry (UNAVAILABLE is one
            // they do). The metadata still says nothing was applied.
            Code::DeadlineExceeded
        } else if err.failure_class() == Some(crate::classify::FailureClass::Final) {
            Code::Internal
        } else {
            Code::Unavailable
        }
    } else if err.is_timeout() {
        Code::DeadlineExceeded
    } else {
        Code::Unknown
    };
    let mut status = Status::new(code, err.to_string());
    let metadata = status.metadata_mut();
    metadata.insert(ATTEMPTS_KEY, MetadataValue::from(err.attempts()));
    if let Ok(mark) = crate::classify::grpc::process_mark().to_str() {
        if let Ok(mark) = mark.parse() {
            metadata.insert(MARK_KEY, mark);
        }
    }
    metadata.insert(
        MAY_HAVE_BEEN_APPLIED_KEY,
        MetadataValue::from_static(if err.may_have_been_applied() {
            "true"
        } else {
            "false"
        }),
    );
    status
}

/// [`status_of`], taking the error: for `map_err`, where `tonic::Status::from` would need
/// its type spelled out.
pub fn into_status(err: Error) -> Status {
    status_of(&err)
}

impl From<Error> for Status {
    fn from(err: Error) -> Self {
        status_of(&err)
    }
}

/// "May this call have been applied?", asked of the `Status` a generated client returns, as an
/// HTTP caller asks it of [`Error`]: the layer's answer from the status's
/// [`MAY_HAVE_BEEN_APPLIED_KEY`] metadata (put there by [`status_of`] and on a failed status
/// the server answered), beside a mark that only this process's layer writes. A status without
/// them (made by tonic or another layer, sent by the server after messages, or by a layer of
/// another process) says nothing the layer knows: `true`, as for any error this crate cannot
/// see into. A server cannot make a call look "not applied" by sending the key itself.
///
/// ```
/// use tower_retry_safety::MayHaveBeenApplied;
///
/// fn tell_the_caller(status: &tonic::Status) -> &'static str {
///     if status.may_have_been_applied() {
///         "the write may have happened: check before calling again"
///     } else {
///         "nothing was applied: safe to call again"
///     }
/// }
/// # assert_eq!(tell_the_caller(&tonic::Status::unavailable("x")), "the write may have happened: check before calling again");
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
impl MayHaveBeenApplied for Status {
    fn may_have_been_applied(&self) -> bool {
        let metadata = self.metadata();
        let ours = metadata.get(MARK_KEY).is_some_and(|mark| {
            mark.as_bytes() == crate::classify::grpc::process_mark().as_bytes()
        });
        let answer = metadata.get(MAY_HAVE_BEEN_APPLIED_KEY);
        !ours || answer.is_none_or(|value| value.as_bytes() != b"false")
    }
}
