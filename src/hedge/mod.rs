//! Hedging: a backup attempt sent when the first is slow, only for requests a repeat cannot
//! harm. [`Hedge`] is the setting; the policy keeps what it learns (latencies per host, the
//! hedge budget) in a `Hedger`.

mod histogram;
mod tokens;

use std::fmt;
use std::time::Duration;

use histogram::HostTable;
use tokens::HedgeTokens;

use crate::build_error::BuildError;
use crate::classify::{Idempotency, RequestVerdict, VerdictSource};

/// The learned delay's floor: below this, a hedge costs more than it saves.
const FLOOR: Duration = Duration::from_millis(1);

/// When to send a backup attempt (a *hedge*) for a slow request, given to
/// [`RetryPolicyBuilder::hedge`](crate::RetryPolicyBuilder::hedge).
///
/// Only requests a repeat cannot harm are hedged: idempotent by method, route rule or marker,
/// and keyed writes (with the same key) only after [`keyed_writes(true)`](Self::keyed_writes).
/// A write that may have been applied — not idempotent, no key its target is trusted to
/// honour — is never hedged, whatever the settings. Nor is a request with a streaming body:
/// a hedge needs a copy of the body while the first attempt is still sending it.
///
/// Each hedge spends the policy's retry budget and counts against
/// [`max_retries`](crate::RetryPolicyBuilder::max_retries) (sends in all ≤ 1 + `max_retries`),
/// and a hedge budget of its own: each hedge-able request deposits
/// [`max_extra_load`](Self::max_extra_load) of a token and a hedge takes a whole one, so hedges
/// never exceed that share of hedge-able requests.
///
/// The first success wins. A failure that could be retried (not sent, a retryable status, a
/// reset) sends the next attempt at once while the others keep running (a retry: it spends the
/// retry budget, not a hedge token) — unless the server asked for a wait (Retry-After), or
/// answered a keyed write's hedge with 409 "still in flight": then the attempts in flight are
/// awaited. A final outcome ends them all. The attempts that lose are dropped: on HTTP/2
/// that resets their stream; on HTTP/1 dropping a request in flight closes its connection, so
/// the pool opens a new one.
///
/// The report counts hedges ([`RetryReport::hedges`](crate::attempts::RetryReport::hedges)), names the
/// attempt that answered ([`won_by`](crate::attempts::RetryReport::won_by)) and the ones dropped
/// ([`superseded`](crate::attempts::RetryReport::superseded)). The
/// [`on_attempt`](crate::RetryPolicyBuilder::on_attempt) hook is called for each attempt the
/// retry table decides on, numbered in the order sent; an attempt that failed while others ran
/// (nothing to decide: the others are awaited) and the dropped ones appear in the report and
/// in their spans, not in the hook.
///
/// ```
/// use std::time::Duration;
/// use tower_retry_safety::{Hedge, RetryPolicy};
///
/// // Hedge at the latency quantile that costs at most 5 % more requests (p95), per host.
/// let policy = RetryPolicy::builder()
///     .hedge(Hedge::learned().max_extra_load(0.05))
///     .build()?;
/// # drop(policy);
/// // Or after a fixed delay.
/// let fixed = RetryPolicy::builder().hedge(Hedge::fixed(Duration::from_millis(20))).build()?;
/// # drop(fixed);
/// // Nonsense is refused, naming the setting.
/// let err = RetryPolicy::builder().hedge(Hedge::learned().max_extra_load(2.0)).build();
/// assert_eq!(err.unwrap_err().setting_name(), "hedge");
/// # Ok::<(), tower_retry_safety::BuildError>(())
/// ```
///
#[doc = include_str!("../docs/hedging.md")]
#[derive(Clone, Debug, PartialEq)]
pub struct Hedge {
    fixed: Option<Duration>,
    max_extra_load: f64,
    min_samples: u32,
    max_hedges: u32,
    keyed_writes: bool,
}

impl Hedge {
    /// Hedge at a latency quantile learned per host: the `1 − max_extra_load` quantile (at
    /// 1 % extra load, p99; at 5 %, p95), as Finagle's `BackupRequestFilter` does, never
    /// below 1 ms. No hedge before [`min_samples`](Self::min_samples) latencies of that host.
    ///
    /// Latencies are those of hedge-able requests: responses but 429 and 5xx, attempts cut
    /// by a timeout and attempts that lost to a hedge (their time so far, a lower bound).
    /// Fast failures are left out, so they do not pull the estimate down.
    pub fn learned() -> Self {
        Hedge {
            fixed: None,
            max_extra_load: 0.05,
            min_samples: 100,
            max_hedges: 1,
            keyed_writes: false,
        }
    }

    /// Hedge after `delay`, above zero.
    pub fn fixed(delay: Duration) -> Self {
        Hedge {
            fixed: Some(delay),
            ..Hedge::learned()
        }
    }

    /// The most extra requests hedges may add, as a share of hedge-able requests: in (0, 1].
    /// For a learned delay it also sets the quantile.
    ///
    /// Defaults to 0.05.
    pub fn max_extra_load(mut self, share: f64) -> Self {
        self.max_extra_load = share;
        self
    }

    /// Latencies a host must have had sampled before its first hedge (learned delay only): at
    /// least 1.
    ///
    /// Defaults to 100.
    pub fn min_samples(mut self, samples: u32) -> Self {
        self.min_samples = samples;
        self
    }

    /// Backup attempts per request sent because the ones in flight are slow, each after the
    /// delay since the last send: 1 to 10.
    ///
    /// Defaults to 1.
    pub fn max_hedges(mut self, hedges: u32) -> Self {
        self.max_hedges = hedges;
        self
    }

    /// Whether writes carrying an idempotency key their target is trusted to honour are
    /// hedged (with the same key; the server answers a hedge that arrives while the first
    /// attempt runs with 409, which is not fatal: the first attempt's answer is awaited).
    ///
    /// Defaults to false.
    pub fn keyed_writes(mut self, hedge: bool) -> Self {
        self.keyed_writes = hedge;
        self
    }

    pub(crate) fn build(self) -> Result<Hedger, BuildError> {
        let bad = |message: String| Err(BuildError::setting("hedge", message));
        if !(self.max_extra_load > 0.0 && self.max_extra_load <= 1.0) {
            return bad(format!(
                "max_extra_load {} is outside (0, 1]",
                self.max_extra_load
            ));
        }
        if self.fixed == Some(Duration::ZERO) {
            return bad("a fixed delay must be above zero".into());
        }
        if self.min_samples == 0 {
            return bad("min_samples must be at least 1".into());
        }
        if !(1..=10).contains(&self.max_hedges) {
            return bad(format!("max_hedges {} is outside 1 to 10", self.max_hedges));
        }
        Ok(Hedger {
            table: self.fixed.is_none().then(HostTable::new),
            tokens: HedgeTokens::new(self.max_extra_load),
            quantile: 1.0 - self.max_extra_load,
            setting: self,
        })
    }
}

/// A policy's hedging: the setting, the latencies it learned and the hedge budget.
pub(crate) struct Hedger {
    setting: Hedge,
    /// Latencies per host, for a learned delay.
    table: Option<HostTable>,
    tokens: HedgeTokens,
    quantile: f64,
}

impl fmt::Debug for Hedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.setting, f)
    }
}

impl Hedger {
    /// Whether a request with this verdict may ever be hedged.
    pub(crate) fn may_hedge(&self, verdict: &RequestVerdict) -> bool {
        if verdict.is_no_retry() {
            return false;
        }
        let idempotent = verdict.idempotency() == Idempotency::Idempotent
            && verdict.source() != VerdictSource::IdempotencyKey;
        // Not idempotent of itself: only a key the target honours makes a repeat harmless.
        idempotent || (self.setting.keyed_writes && verdict.is_keyed())
    }

    /// The latency slot of a host (learned delay only).
    pub(crate) fn slot<'h>(&self, host: impl FnOnce() -> Option<(&'h str, Option<u16>)>) -> usize {
        self.table.as_ref().map_or(0, |t| t.slot(host()))
    }

    /// The delay before a hedge to this slot's host: `None` while it has too few samples.
    pub(crate) fn delay(&self, slot: usize) -> Option<Duration> {
        if let Some(fixed) = self.setting.fixed {
            return Some(fixed);
        }
        let h = self.table.as_ref()?.get(slot);
        if h.samples() < u64::from(self.setting.min_samples) {
            return None;
        }
        Some(h.cached()?.max(FLOOR))
    }

    /// Counts a latency of this slot's host (learned delay only).
    pub(crate) fn add_sample(&self, slot: usize, latency: Duration) {
        if let Some(table) = &self.table {
            table.get(slot).add_sample(latency, self.quantile);
        }
    }

    /// Latencies counted for a slot (learned delay only).
    #[cfg(test)]
    pub(crate) fn samples(&self, slot: usize) -> u64 {
        self.table.as_ref().map_or(0, |t| t.get(slot).samples())
    }

    pub(crate) fn max_hedges(&self) -> u32 {
        self.setting.max_hedges
    }

    pub(crate) fn tokens(&self) -> &HedgeTokens {
        &self.tokens
    }
}

#[cfg(test)]
mod tests;
