//! The command line's error: one line naming the input at fault, as the library's
//! [`LabError`] prints one (the command line's own errors, and the library's passed on).

use std::fmt;

use retry_safety_lab::LabError;

/// A bad argument, or an error of the library: printed as `INPUT: REASON`.
#[derive(Debug)]
pub(super) struct CliError(String);

impl CliError {
    pub(super) fn new(input: impl Into<String>, reason: impl Into<String>) -> Self {
        CliError(format!("{}: {}", input.into(), reason.into()))
    }
}

impl From<LabError> for CliError {
    fn from(err: LabError) -> Self {
        CliError(err.to_string())
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
