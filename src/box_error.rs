//! The boxed error type: a leaf that every layer of the crate uses.

/// The boxed error type that inner services' errors are converted into.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
