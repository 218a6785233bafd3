use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, Method, StatusCode};
use tower::retry::budget::{Budget, TpsBudget};

use super::host_routes::HostRoutes;
use super::key_trust::KeyTrust;
use super::{AttemptEvent, AttemptHook, Headers, Inner, RetryPolicy, DEFAULT_KEY_HEADER};
use crate::backoff::Backoff;
use crate::budget::LockFreeBudget;
use crate::build_error::BuildError;
use crate::classify::response::{ResponseHook, ResponseRules};
use crate::classify::routes::RouteTable;
use crate::classify::{FailureClass, Idempotency};
pub(crate) use described::DescribedRoutes;

/// The replay buffer's default limit, in bytes.
const DEFAULT_REPLAY_BUFFER: usize = 64 * 1024;
/// The largest replay buffer a policy may keep per request.
const MAX_REPLAY_BUFFER: usize = 1 << 30;

/// The most retries a policy may allow. More than this is a retry storm, not a policy.
pub(crate) const MAX_RETRIES_LIMIT: u32 = 100;

/// Builds a [`RetryPolicy`]. Setters consume and return the builder; nothing is checked until
/// [`build`](Self::build), which names the first bad input in its [`BuildError`].
#[derive(Debug)]
pub struct RetryPolicyBuilder {
    rules: Rules,
    timing: Timing,
    responses: Responses,
    headers: Headers,
    hedge: Option<crate::hedge::Hedge>,
    /// Deadlines across hops.
    hops: deadlines::HopSettings,
    /// The meter the policy's instruments are made with, if any.
    #[cfg(feature = "opentelemetry")]
    meter: Option<opentelemetry::metrics::Meter>,
}

/// Route rules, host rules and trust in keys, as given (checked in `build`).
#[derive(Debug)]
struct Rules {
    routes: Vec<(Method, String, Idempotency)>,
    host_routes: Vec<(String, Method, String, Idempotency)>,
    honor_idempotency_key: bool,
    key_hosts: Vec<String>,
    key_routes: Vec<(Method, String, bool)>,
    mint_idempotency_keys: bool,
    /// Routes read from a service's description (the gRPC front end's descriptor sets), or
    /// why one was refused.
    described: DescribedRoutes,
}

/// How many retries, when, and within what.
#[derive(Debug)]
struct Timing {
    max_retries: u32,
    backoff: Backoff,
    jitter: bool,
    deadline: Option<Duration>,
    attempt_timeout: Option<Duration>,
    replay_buffer: usize,
    budget: BudgetChoice,
}

/// What responses say, as given.
#[derive(Debug)]
struct Responses {
    retry_statuses: Vec<StatusCode>,
    not_applied_statuses: Vec<StatusCode>,
    response_hook: Option<ResponseHook>,
    on_attempt: Option<AttemptHook>,
    max_retry_after: Duration,
    should_retry_header: Option<HeaderName>,
    stored_response_header: Option<HeaderName>,
}

enum BudgetChoice {
    LockFree {
        ttl: Duration,
        min_per_sec: u32,
        retry_percent: f32,
    },
    Tps {
        ttl: Duration,
        min_per_sec: u32,
        retry_percent: f32,
    },
    Custom(Arc<dyn Budget + Send + Sync>),
    Unlimited,
}

impl fmt::Debug for BudgetChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BudgetChoice::LockFree {
                ttl,
                min_per_sec,
                retry_percent,
            } => f
                .debug_struct("LockFreeBudget")
                .field("ttl", ttl)
                .field("min_per_sec", min_per_sec)
                .field("retry_percent", retry_percent)
                .finish(),
            BudgetChoice::Tps {
                ttl,
                min_per_sec,
                retry_percent,
            } => f
                .debug_struct("TpsBudget")
                .field("ttl", ttl)
                .field("min_per_sec", min_per_sec)
                .field("retry_percent", retry_percent)
                .finish(),
            BudgetChoice::Custom(_) => f.write_str("Custom"),
            BudgetChoice::Unlimited => f.write_str("Unlimited"),
        }
    }
}

impl RetryPolicy {
    /// A builder with safe defaults; each setter documents its default.
    pub fn builder() -> RetryPolicyBuilder {
        RetryPolicyBuilder::new()
    }
}

impl Default for RetryPolicyBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryPolicyBuilder {
    /// Where a front end that reads a service's description (gRPC's descriptor sets) puts
    /// the idempotent paths it found.
    #[allow(dead_code)] // without the gRPC front end (feature `tonic`), nothing describes routes
    pub(crate) fn described_routes(&mut self) -> &mut DescribedRoutes {
        &mut self.rules.described
    }
}

impl RetryPolicyBuilder {
    /// A builder with the defaults listed on each setter.
    pub fn new() -> Self {
        RetryPolicyBuilder {
            rules: Rules {
                routes: Vec::new(),
                host_routes: Vec::new(),
                honor_idempotency_key: false,
                key_hosts: Vec::new(),
                key_routes: Vec::new(),
                mint_idempotency_keys: false,
                described: DescribedRoutes::default(),
            },
            timing: Timing {
                max_retries: 2,
                backoff: Backoff {
                    initial: Duration::from_millis(500),
                    max: Duration::from_secs(8),
                },
                jitter: true,
                deadline: None,
                attempt_timeout: None,
                replay_buffer: DEFAULT_REPLAY_BUFFER,
                budget: BudgetChoice::LockFree {
                    ttl: Duration::from_secs(10),
                    min_per_sec: 10,
                    retry_percent: 0.2,
                },
            },
            responses: Responses {
                retry_statuses: [408, 429, 500, 502, 503, 504]
                    .into_iter()
                    .filter_map(|s| StatusCode::from_u16(s).ok())
                    .collect(),
                not_applied_statuses: Vec::new(),
                response_hook: None,
                on_attempt: None,
                max_retry_after: Duration::from_secs(60),
                should_retry_header: Some(HeaderName::from_static("x-should-retry")),
                stored_response_header: Some(HeaderName::from_static("idempotent-replayed")),
            },
            headers: Headers {
                idempotency_key_header: DEFAULT_KEY_HEADER,
                custom_key_header: false,
                request_id_header: Some(HeaderName::from_static("x-request-id")),
                attempt_header: None,
            },
            hedge: None,
            hops: deadlines::HopSettings::new(),
            #[cfg(feature = "opentelemetry")]
            meter: None,
        }
    }

    /// Checks every setting and builds the policy.
    pub fn build(#[allow(unused_mut)] mut self) -> Result<RetryPolicy, BuildError> {
        self.check_limits()?;
        #[cfg(feature = "opentelemetry")]
        let grpc_methods = self.rules.grpc_methods();
        self.rules.described.add_to(&mut self.rules.routes)?;
        let hedge = self.hedge.map(crate::hedge::Hedge::build).transpose()?;
        let key_trust = self.rules.key_trust()?;
        let (routes, host_routes) = self.rules.route_tables()?;
        let budget = self.timing.budget.build()?;
        let hops = self.hops.build()?;
        Ok(RetryPolicy {
            origin: None,
            inner: Arc::new(Inner {
                max_retries: self.timing.max_retries,
                routes,
                host_routes,
                key_trust,
                mint_idempotency_keys: self.rules.mint_idempotency_keys,
                backoff: self.timing.backoff,
                jitter: self.timing.jitter,
                responses: ResponseRules {
                    retry_statuses: self.responses.retry_statuses.into_iter().collect(),
                    not_applied_statuses: self.responses.not_applied_statuses.into_iter().collect(),
                    hook: self.responses.response_hook,
                    max_retry_after: self.responses.max_retry_after,
                    should_retry_header: self.responses.should_retry_header,
                    stored_response_header: self.responses.stored_response_header,
                },
                on_attempt: self.responses.on_attempt,
                deadline: self.timing.deadline,
                attempt_timeout: self.timing.attempt_timeout,
                replay_buffer: self.timing.replay_buffer,
                budget,
                headers: self.headers,
                hedge,
                hops,
                #[cfg(feature = "opentelemetry")]
                metrics: self
                    .meter
                    .as_ref()
                    .map(|m| crate::metrics::client::ClientInstruments::new(m, grpc_methods)),
                warned_host_unknown: Default::default(),
            }),
        })
    }

    /// The settings' bounds, each failing with an error that names the setting.
    fn check_limits(&self) -> Result<(), BuildError> {
        if self.timing.max_retries > MAX_RETRIES_LIMIT {
            return Err(BuildError::setting(
                "max_retries",
                format!(
                    "{} is above the limit of {MAX_RETRIES_LIMIT}",
                    self.timing.max_retries
                ),
            ));
        }
        if self.timing.backoff.initial > self.timing.backoff.max {
            return Err(BuildError::setting(
                "backoff",
                format!(
                    "initial {:?} is above max {:?}",
                    self.timing.backoff.initial, self.timing.backoff.max
                ),
            ));
        }
        if let Some(success) = self
            .responses
            .not_applied_statuses
            .iter()
            .find(|s| s.is_success())
        {
            return Err(BuildError::setting(
                "not_applied_statuses",
                format!("{success} is a success status: it proves the request was applied"),
            ));
        }
        if let Some(success) = self
            .responses
            .retry_statuses
            .iter()
            .find(|s| s.is_success())
        {
            return Err(BuildError::setting(
                "retry_statuses",
                format!("{success} is a success status and cannot be retried"),
            ));
        }
        if self.timing.deadline == Some(Duration::ZERO) {
            return Err(BuildError::setting("deadline", "it must be above zero"));
        }
        if self.timing.attempt_timeout == Some(Duration::ZERO) {
            return Err(BuildError::setting(
                "attempt_timeout",
                "it must be above zero",
            ));
        }
        if self.timing.replay_buffer > MAX_REPLAY_BUFFER {
            return Err(BuildError::setting(
                "replay_buffer",
                format!(
                    "{} bytes is over the 1 GiB a request may keep",
                    self.timing.replay_buffer
                ),
            ));
        }
        Ok(())
    }
}

impl Rules {
    /// Trust in idempotency keys: everywhere, or on the hosts and routes named.
    fn key_trust(&self) -> Result<KeyTrust, BuildError> {
        let mut key_trust = KeyTrust {
            everywhere: self.honor_idempotency_key
                || (self.mint_idempotency_keys && self.key_hosts.is_empty()),
            hosts: Vec::new(),
            routes: RouteTable::default(),
        };
        for host in &self.key_hosts {
            key_trust.add_host(host)?;
        }
        for (method, template, honors) in &self.key_routes {
            key_trust.add_route(method.clone(), template, *honors)?;
        }
        Ok(key_trust)
    }

    /// The route rules, for any host and per host.
    fn route_tables(&self) -> Result<(RouteTable, HostRoutes), BuildError> {
        let mut routes = RouteTable::default();
        for (method, template, idempotency) in &self.routes {
            routes.insert(method.clone(), template, *idempotency)?;
        }
        let mut host_routes = HostRoutes::default();
        for (host, method, template, idempotency) in &self.host_routes {
            host_routes.insert(host, method.clone(), template, *idempotency)?;
        }
        Ok((routes, host_routes))
    }
}

impl BudgetChoice {
    /// The budget chosen, checked (`None`: unlimited).
    fn build(self) -> Result<Option<Arc<dyn Budget + Send + Sync>>, BuildError> {
        Ok(match self {
            BudgetChoice::LockFree {
                ttl,
                min_per_sec,
                retry_percent,
            } => Some(Arc::new(LockFreeBudget::new(
                ttl,
                min_per_sec,
                retry_percent,
            )?)),
            BudgetChoice::Tps {
                ttl,
                min_per_sec,
                retry_percent,
            } => {
                check_tps(ttl, min_per_sec, retry_percent)?;
                Some(Arc::new(TpsBudget::new(ttl, min_per_sec, retry_percent)))
            }
            BudgetChoice::Custom(budget) => Some(budget),
            BudgetChoice::Unlimited => None,
        })
    }
}

/// The bounds `TpsBudget::new` asserts, checked here so a bad value is an error, not a panic.
fn check_tps(ttl: Duration, min_per_sec: u32, retry_percent: f32) -> Result<(), BuildError> {
    if ttl < Duration::from_secs(1) || ttl > Duration::from_secs(60) {
        return Err(BuildError::setting(
            "tps_budget",
            format!("ttl {ttl:?} is outside 1 s to 60 s"),
        ));
    }
    if !(0.0..=1000.0).contains(&retry_percent) {
        return Err(BuildError::setting(
            "tps_budget",
            format!("retry_percent {retry_percent} is outside 0 to 1000"),
        ));
    }
    if min_per_sec >= i32::MAX as u32 {
        return Err(BuildError::setting(
            "tps_budget",
            format!("min_per_sec {min_per_sec} is not below {}", i32::MAX),
        ));
    }
    Ok(())
}

mod deadlines;
mod described;
mod headers;
mod hedge;
mod limits;
#[cfg(feature = "opentelemetry")]
mod metrics;
mod responses;
mod rules;
#[cfg(test)]
mod tests;
mod timing;
