//! The client's instruments, made once when a policy is built, and what each request records
//! in them. The decision core calls these at two points only: when a resend that is not a
//! hedge is sent, and when the request ends (its report is made).

use std::fmt;
use std::time::Duration;

use opentelemetry::metrics::{Counter, Histogram, Meter};
use opentelemetry::KeyValue;

pub(crate) use super::attributes::Label;
use super::attributes::{AttributeSets, Method, Set};
use crate::classify::{FailureClass, VerdictSource};
use crate::target::Target;

/// Buckets of the attempts histogram: one bucket per count up to 6, then coarser.
const ATTEMPT_BUCKETS: [f64; 8] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 11.0];
/// Buckets of the wait histogram, in seconds: OpenTelemetry's HTTP duration buckets, up to a
/// minute (`max_retry_after`'s default).
const WAIT_BUCKETS: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 30.0, 60.0,
];

/// The client's instruments (see the [module docs](crate::metrics) for each).
pub(crate) struct ClientInstruments {
    attempts: Histogram<u64>,
    retries: Counter<u64>,
    wait: Histogram<f64>,
    hedges: Counter<u64>,
    hedge_wins: Counter<u64>,
    superseded: Counter<u64>,
    suppressed: Counter<u64>,
    refused: Counter<u64>,
    stored_responses: Counter<u64>,
    /// gRFC A96's per-call histograms, for gRPC calls.
    grpc: GrpcInstruments,
    /// The attribute sets, built once per combination.
    sets: AttributeSets,
}

/// gRFC A96's instruments: per gRPC call, recorded only when the call was resent.
struct GrpcInstruments {
    retries: Histogram<u64>,
    transparent_retries: Histogram<u64>,
    hedges: Histogram<u64>,
    retry_delay: Histogram<f64>,
    /// `grpc.method`'s values: the methods the policy knows, by name, each with its set.
    methods: Box<[(Box<str>, [KeyValue; 1])]>,
    /// Every other method's set (`other`).
    other: [KeyValue; 1],
}

/// What a gRPC call's resends were, as gRFC A96 counts them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GrpcCall {
    /// Resends after an attempt that may have reached the server (not hedges).
    pub(crate) retries: u32,
    /// Resends after an attempt that provably did not (not sent).
    pub(crate) transparent_retries: u32,
    /// The waits before the resends, summed.
    pub(crate) delay: Duration,
}

impl fmt::Debug for ClientInstruments {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClientInstruments(..)")
    }
}

/// How a request ended, as its metrics read it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ended {
    /// Attempts sent, the superseded included (`RetryReport::attempts`).
    pub(crate) attempts: u32,
    /// Why there was no further attempt (`StopReason`).
    pub(crate) stop: Label,
    /// The retry of a write that may have been applied was suppressed.
    pub(crate) suppressed: bool,
    /// A retry that the failure called for was refused (budget, deadline, body, a wait too
    /// long).
    pub(crate) refused: bool,
    /// The response is the server's stored response to the key.
    pub(crate) stored_response: bool,
    /// The last attempt's failure class.
    pub(crate) last_class: Option<FailureClass>,
    pub(crate) hedges: u32,
    pub(crate) hedge_won: bool,
    pub(crate) superseded: u32,
    /// A gRPC call's resends, for gRFC A96's instruments.
    pub(crate) grpc: Option<GrpcCall>,
}

impl GrpcInstruments {
    /// gRFC A96's instruments, with `methods` as the only `grpc.method` values besides
    /// `other`.
    fn new(meter: &Meter, methods: Vec<String>) -> Self {
        let mut names: Vec<Box<str>> = methods.into_iter().map(Into::into).collect();
        names.sort_unstable();
        names.dedup();
        let methods: Box<[_]> = names
            .into_iter()
            .map(|name| {
                let set = [KeyValue::new("grpc.method", name.to_string())];
                (name, set)
            })
            .collect();
        GrpcInstruments {
            retries: meter
                .u64_histogram("grpc.client.call.retries")
                .with_unit("{retry}")
                .with_description("Number of retries during the client call (gRFC A96)")
                .with_boundaries(ATTEMPT_BUCKETS.to_vec())
                .build(),
            transparent_retries: meter
                .u64_histogram("grpc.client.call.transparent_retries")
                .with_unit("{transparent_retry}")
                .with_description("Number of transparent retries during the client call (gRFC A96)")
                .with_boundaries(ATTEMPT_BUCKETS.to_vec())
                .build(),
            hedges: meter
                .u64_histogram("grpc.client.call.hedges")
                .with_unit("{hedge}")
                .with_description("Number of hedges during the client call (gRFC A96)")
                .with_boundaries(ATTEMPT_BUCKETS.to_vec())
                .build(),
            retry_delay: meter
                .f64_histogram("grpc.client.call.retry_delay")
                .with_unit("s")
                .with_description(
                    "Total time of delay while there is no active attempt during the \
                     client call (gRFC A96)",
                )
                .with_boundaries(WAIT_BUCKETS.to_vec())
                .build(),
            methods,
            other: [KeyValue::new("grpc.method", "other")],
        }
    }
}

impl ClientInstruments {
    /// The instruments, with `grpc_methods` (full names, `package.Service/Method`) as the
    /// only `grpc.method` values besides `other`.
    pub(crate) fn new(meter: &Meter, grpc_methods: Vec<String>) -> Self {
        ClientInstruments {
            sets: AttributeSets::default(),
            attempts: meter
                .u64_histogram("retry_safety.client.attempts")
                .with_unit("{attempt}")
                .with_description("Attempts sent per request, the first one and every resend")
                .with_boundaries(ATTEMPT_BUCKETS.to_vec())
                .build(),
            retries: meter
                .u64_counter("retry_safety.client.retries")
                .with_unit("{retry}")
                .with_description(
                    "Resends after a failed attempt (hedges apart), by the failed attempt's class: \
                     not-sent ones are transparent",
                )
                .build(),
            wait: meter
                .f64_histogram("retry_safety.client.retry.wait")
                .with_unit("s")
                .with_description("The wait decided before each resend (backoff or Retry-After)")
                .with_boundaries(WAIT_BUCKETS.to_vec())
                .build(),
            hedges: meter
                .u64_counter("retry_safety.client.hedges")
                .with_unit("{hedge}")
                .with_description("Hedges sent: backup attempts while the first was slow")
                .build(),
            hedge_wins: meter
                .u64_counter("retry_safety.client.hedge.wins")
                .with_unit("{request}")
                .with_description("Hedged requests whose response came from a later attempt than the first")
                .build(),
            superseded: meter
                .u64_counter("retry_safety.client.attempts.superseded")
                .with_unit("{attempt}")
                .with_description("Attempts dropped in flight because another's outcome was returned")
                .build(),
            suppressed: meter
                .u64_counter("retry_safety.client.writes.suppressed")
                .with_unit("{request}")
                .with_description(
                    "Requests not retried because they are not idempotent and may have been applied",
                )
                .build(),
            refused: meter
                .u64_counter("retry_safety.client.retries.refused")
                .with_unit("{request}")
                .with_description(
                    "Requests whose retry was refused by the budget, the deadline, a body that \
                     cannot be sent again, or a Retry-After too long",
                )
                .build(),
            stored_responses: meter
                .u64_counter("retry_safety.client.stored_responses")
                .with_unit("{response}")
                .with_description(
                    "Responses that are the server's stored response to an idempotency key",
                )
                .build(),
            grpc: GrpcInstruments::new(meter, grpc_methods),
        }
    }

    /// A resend that is not a hedge, after an attempt of class `class` and a wait of `wait`.
    #[cold]
    pub(crate) fn retry(
        &self,
        target: &Target,
        source: VerdictSource,
        class: FailureClass,
        wait: Option<Duration>,
    ) {
        let method = Method::of(&target.method);
        let sets = [Set::Class(method, source, class), Set::Method(method)];
        self.sets
            .with(target.host(), sets, |[by_class, by_method]| {
                self.retries.add(1, by_class);
                if let Some(wait) = wait {
                    self.wait.record(wait.as_secs_f64(), by_method);
                }
            });
    }

    /// A request's end: its attempts, and what stopped them.
    pub(crate) fn ended(&self, target: &Target, source: VerdictSource, ended: Ended) {
        let method = Method::of(&target.method);
        if !ended.suppressed && !ended.refused && !ended.has_more() {
            // The common end (one attempt, answered): one set, one record.
            let sets = [Set::Stop(method, source, ended.stop)];
            self.sets.with(target.host(), sets, |[by_stop]| {
                self.attempts.record(u64::from(ended.attempts), by_stop);
            });
        } else {
            let class = ended.last_class.unwrap_or(FailureClass::Ambiguous);
            let sets = [
                Set::Stop(method, source, ended.stop),
                Set::Class(method, source, class),
                Set::Method(method),
            ];
            self.sets
                .with(target.host(), sets, |sets| self.ended_all(&ended, sets));
        }
        if let Some(call) = ended.grpc {
            self.grpc_call(target, call, ended.hedges);
        }
    }

    /// A request's end that recorded more than its attempts.
    #[cold]
    fn ended_all(&self, ended: &Ended, [by_stop, by_class, by_method]: [&[KeyValue]; 3]) {
        self.attempts.record(u64::from(ended.attempts), by_stop);
        if ended.suppressed {
            self.suppressed.add(1, by_class);
        }
        if ended.refused {
            self.refused.add(1, by_stop);
        }
        if ended.stored_response {
            self.stored_responses.add(1, by_method);
        }
        if ended.hedges > 0 {
            self.hedges.add(u64::from(ended.hedges), by_method);
        }
        if ended.hedge_won {
            self.hedge_wins.add(1, by_method);
        }
        if ended.superseded > 0 {
            self.superseded.add(u64::from(ended.superseded), by_method);
        }
    }

    /// gRFC A96's histograms for a gRPC call: each only when it is not zero, as A96 has it,
    /// the delay only for a call that was resent.
    #[cold]
    fn grpc_call(&self, target: &Target, call: GrpcCall, hedges: u32) {
        let g = &self.grpc;
        // A method the policy knows (a route, a proto's method), else `other`: any POST with
        // a gRPC content type is a call, and a caller may invent its path.
        let attributes = crate::classify::grpc::method_name(target.path())
            .and_then(|name| {
                let at = g.methods.binary_search_by(|(n, _)| (**n).cmp(name)).ok()?;
                Some(&g.methods[at].1)
            })
            .unwrap_or(&g.other);
        if call.retries > 0 {
            g.retries.record(u64::from(call.retries), attributes);
        }
        if call.transparent_retries > 0 {
            g.transparent_retries
                .record(u64::from(call.transparent_retries), attributes);
        }
        if hedges > 0 {
            g.hedges.record(u64::from(hedges), attributes);
        }
        if call.retries + call.transparent_retries + hedges > 0 {
            g.retry_delay.record(call.delay.as_secs_f64(), attributes);
        }
    }
}

impl Ended {
    /// Whether anything besides the attempts is recorded.
    fn has_more(&self) -> bool {
        self.stored_response || self.hedges > 0 || self.hedge_won || self.superseded > 0
    }
}
