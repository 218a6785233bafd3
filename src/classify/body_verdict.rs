use http::Extensions;

use super::FailureClass;

/// A response's class as a body classifier inside the layer found it (see
/// [`PeekBodyLayer`](crate::peek::PeekBodyLayer)), carried to the layer in the response's
/// extensions. It speaks before the policy's rules, with the same limits as
/// `classify_responses_with`: only `NotSent` makes a write that may have been applied
/// retryable.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BodyVerdict(pub(crate) FailureClass);

impl BodyVerdict {
    /// Adds a classifier's verdict; of two (stacked classifiers), the stricter holds: `Final`
    /// over a retryable response, which holds over `NotSent` (the one that lets a write be
    /// retried).
    pub(crate) fn add(extensions: &mut Extensions, class: FailureClass) {
        let strictness = |c: FailureClass| match c {
            FailureClass::NotSent => 0,
            FailureClass::Ambiguous | FailureClass::RetryableResponse => 1,
            FailureClass::Final => 2,
        };
        let stricter = match extensions.get::<BodyVerdict>() {
            Some(BodyVerdict(held)) => strictness(class) > strictness(*held),
            None => true,
        };
        if stricter {
            extensions.insert(BodyVerdict(class));
        }
    }

    /// Takes the verdict out of a response this layer has decided on: it described this
    /// request's attempt, and an outer retry layer (around a handler that made the request
    /// and returned its response) must not take it for its own.
    pub(crate) fn take(extensions: &mut Extensions) -> Option<FailureClass> {
        extensions.remove::<BodyVerdict>().map(|v| v.0)
    }
}
