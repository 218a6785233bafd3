//! What the layer counts in its OpenTelemetry instruments, when it was given a meter
//! (feature `opentelemetry`). Without the feature, `Observe` has no field and its methods
//! nothing to do; with it and no meter, each costs one check of an `Option`.

use http::Method;

/// How the layer handled a request that carried a key (or needed one): the value of
/// `retry_safety.key.outcome`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeyHandling {
    /// The key was claimed: the handler runs.
    Claimed,
    /// A repeat answered from the stored response.
    StoredResponse,
    /// A repeat while the first is in flight: 409.
    InFlight,
    /// The key was used with a different request: 422.
    Mismatch,
    /// The key is not a well-formed key: 400.
    MalformedKey,
    /// The method needs a key and the request has none: 400.
    MissingKey,
    /// Refused before a claim: its body too large (413), unreadable or unscoped (400).
    Rejected,
    /// The store failed or refused the claim: 503.
    StoreError,
    /// Claimed, then refused before its handler ran: the runtime has no timer (503).
    Unavailable,
}

/// How one renewal of a claim's lease ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RenewalResult {
    /// The lease was extended.
    Renewed,
    /// Refused by fencing: another claim holds the key now.
    Fenced,
    /// The store failed, or did not answer within the renewal interval.
    Failed,
}

/// How atomic mode ended a keyed request's transaction.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TransactionResult {
    /// The handler's writes and the key's entry committed together.
    Committed,
    /// The commit was not acknowledged: 503.
    CommitUnconfirmed,
    /// Rolled back: the handler failed, answered a 5xx not to be stored, or a statement failed.
    RolledBack,
    /// The handler ended or kept the transaction itself: the key keeps an unknown outcome.
    Unknown,
}

/// The layer's instruments, if it was given a meter.
#[derive(Clone, Debug, Default)]
pub(crate) struct Observe {
    #[cfg(feature = "opentelemetry")]
    instruments: Option<std::sync::Arc<instruments::ServerInstruments>>,
}

impl Observe {
    /// Instruments made once from `meter`.
    #[cfg(feature = "opentelemetry")]
    pub(crate) fn new(meter: &opentelemetry::metrics::Meter) -> Self {
        Observe {
            instruments: Some(std::sync::Arc::new(instruments::ServerInstruments::new(
                meter,
            ))),
        }
    }

    /// A keyed request handled as `handling`.
    #[inline]
    pub(crate) fn keyed(&self, method: &Method, handling: KeyHandling) {
        #[cfg(feature = "opentelemetry")]
        if let Some(i) = &self.instruments {
            i.keyed(method, handling);
        }
        #[cfg(not(feature = "opentelemetry"))]
        let _ = (method, handling);
    }

    /// Atomic mode ended a transaction as `result`.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    #[inline]
    pub(crate) fn transaction(&self, result: TransactionResult) {
        #[cfg(feature = "opentelemetry")]
        if let Some(i) = &self.instruments {
            i.transaction(result);
        }
        #[cfg(not(feature = "opentelemetry"))]
        let _ = result;
    }

    /// A renewal of a claim's lease ended as `result`.
    #[inline]
    pub(crate) fn renewal(&self, result: RenewalResult) {
        #[cfg(feature = "opentelemetry")]
        if let Some(i) = &self.instruments {
            i.renewal(result);
        }
        #[cfg(not(feature = "opentelemetry"))]
        let _ = result;
    }
}

#[cfg(feature = "opentelemetry")]
mod instruments {
    use std::fmt;

    use http::Method;
    use opentelemetry::metrics::{Counter, Meter};
    use opentelemetry::KeyValue;

    use super::{KeyHandling, RenewalResult, TransactionResult};

    impl KeyHandling {
        fn as_str(self) -> &'static str {
            match self {
                KeyHandling::Claimed => "claimed",
                KeyHandling::StoredResponse => "stored-response",
                KeyHandling::InFlight => "in-flight",
                KeyHandling::Mismatch => "mismatch",
                KeyHandling::MalformedKey => "malformed-key",
                KeyHandling::MissingKey => "missing-key",
                KeyHandling::Rejected => "rejected",
                KeyHandling::StoreError => "store-error",
                KeyHandling::Unavailable => "unavailable",
            }
        }
    }

    impl RenewalResult {
        fn as_str(self) -> &'static str {
            match self {
                RenewalResult::Renewed => "renewed",
                RenewalResult::Fenced => "fenced",
                RenewalResult::Failed => "failed",
            }
        }
    }

    impl TransactionResult {
        fn as_str(self) -> &'static str {
            match self {
                TransactionResult::Committed => "committed",
                TransactionResult::CommitUnconfirmed => "commit-unconfirmed",
                TransactionResult::RolledBack => "rolled-back",
                TransactionResult::Unknown => "unknown",
            }
        }
    }

    /// The server layer's instruments (see the crate docs' Metrics section).
    pub(super) struct ServerInstruments {
        keyed: Counter<u64>,
        renewals: Counter<u64>,
        transactions: Counter<u64>,
    }

    impl fmt::Debug for ServerInstruments {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("ServerInstruments(..)")
        }
    }

    impl ServerInstruments {
        pub(super) fn new(meter: &Meter) -> Self {
            ServerInstruments {
                keyed: meter
                    .u64_counter("retry_safety.server.keyed_requests")
                    .with_unit("{request}")
                    .with_description(
                        "Requests with an idempotency key (or without one where it is \
                         required), by how the layer answered them",
                    )
                    .build(),
                renewals: meter
                    .u64_counter("retry_safety.server.lease.renewals")
                    .with_unit("{renewal}")
                    .with_description(
                        "Renewals of a claim's lease while its handler runs, by result",
                    )
                    .build(),
                transactions: meter
                    .u64_counter("retry_safety.server.atomic.transactions")
                    .with_unit("{transaction}")
                    .with_description(
                        "Atomic mode's keyed transactions (handler and key together), by how \
                         each ended",
                    )
                    .build(),
            }
        }

        pub(super) fn transaction(&self, result: TransactionResult) {
            self.transactions.add(
                1,
                &[KeyValue::new(
                    "retry_safety.transaction.result",
                    result.as_str(),
                )],
            );
        }

        pub(super) fn keyed(&self, method: &Method, handling: KeyHandling) {
            self.keyed.add(
                1,
                &[
                    tower_retry_safety::metrics::http_request_method(method),
                    KeyValue::new("retry_safety.key.outcome", handling.as_str()),
                ],
            );
        }

        pub(super) fn renewal(&self, result: RenewalResult) {
            self.renewals.add(
                1,
                &[KeyValue::new(
                    "retry_safety.renewal.result",
                    result.as_str(),
                )],
            );
        }
    }
}
