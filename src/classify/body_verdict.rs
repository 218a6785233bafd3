use super::FailureClass;

/// A response's class as a body classifier inside the layer found it (see
/// [`PeekBodyLayer`](crate::PeekBodyLayer)), carried to the layer in the response's
/// extensions. It speaks before the policy's rules, with the same limits as
/// `classify_responses_with`: only `NotSent` makes a write that may have been applied
/// retryable.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BodyVerdict(pub(crate) FailureClass);
