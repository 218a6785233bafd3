//! What the policy decides, and what a hook sees: [`Decision`] after each attempt and
//! [`AttemptEvent`] for [`on_attempt`](crate::RetryPolicyBuilder::on_attempt). The policy itself is
//! [`RetryPolicy`], built with [`RetryPolicyBuilder`](crate::RetryPolicyBuilder).
#![doc = include_str!("../docs/policy.md")]

pub(crate) mod builder;
mod decide;
pub(crate) mod decision;
mod events;
pub(crate) mod hops;
mod host_routes;
mod key_trust;
pub(crate) mod options;
pub(crate) mod retry_policy;

pub use decision::Decision;
pub use events::AttemptEvent;

pub(crate) use decision::{Facts, StopReason};
pub(crate) use events::AttemptHook;
pub(crate) use options::RequestOptions;
pub(crate) use retry_policy::{Headers, Inner, RetryPolicy, DEFAULT_KEY_HEADER};
