//! The error of a refused builder setting: a leaf that the route tables, the host scopes and
//! the builder all use.

use std::fmt;

use http::Method;

/// A setting that [`RetryPolicyBuilder::build`](crate::RetryPolicyBuilder::build) refused. Its `Display` names the setting and
/// the bad value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildError {
    setting: &'static str,
    message: String,
}

impl BuildError {
    pub(crate) fn setting(setting: &'static str, message: impl Into<String>) -> Self {
        BuildError {
            setting,
            message: message.into(),
        }
    }

    pub(crate) fn host(setting: &'static str, host: &str, reason: &str) -> Self {
        BuildError {
            setting,
            message: format!("{host:?}: {reason}"),
        }
    }

    pub(crate) fn route(method: &Method, template: &str, reason: impl fmt::Display) -> Self {
        BuildError {
            setting: "route",
            message: format!("{method} {template}: {reason}"),
        }
    }

    pub(crate) fn for_setting(mut self, setting: &'static str) -> Self {
        self.setting = setting;
        self
    }

    /// The name of the builder setting that was refused, such as `"backoff"` or `"route"`.
    pub fn setting_name(&self) -> &'static str {
        self.setting
    }
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid retry policy setting `{}`: {}",
            self.setting, self.message
        )
    }
}

impl std::error::Error for BuildError {}
