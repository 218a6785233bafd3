//! The lab's one error type: a line that names the input at fault.

use std::fmt;

/// A command-line argument, an address or an upstream the lab cannot use. Its `Display` is
/// one line naming the input (a flag, an address) and what is wrong with it; it never
/// contains a header value or a body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabError {
    input: String,
    reason: String,
}

impl LabError {
    pub(crate) fn new(input: impl Into<String>, reason: impl Into<String>) -> Self {
        LabError {
            input: input.into(),
            reason: reason.into(),
        }
    }

    /// The input at fault: a flag (`--op-id`), a subcommand, or an address.
    pub fn input(&self) -> &str {
        &self.input
    }
}

impl fmt::Display for LabError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.input, self.reason)
    }
}

impl std::error::Error for LabError {}
