//! `OVERHEAD_ONLY=<variant>:<n>`: `n` requests through one variant and nothing else, for
//! instruction counts under callgrind (`scripts/instructions.sh`).

#[cfg(feature = "opentelemetry")]
use std::hint::black_box;
use std::time::Duration;

use tower_retry_safety::RetryPolicy;

use super::{one, put, spans_off, Instant200, Kind, Stacks};

/// Runs `variant:n` (see the bench's front comment for the variants).
pub(crate) async fn run(only: &str, policy: &RetryPolicy, s: &mut Stacks) {
    let (variant, n) = only.split_once(':').expect("OVERHEAD_ONLY=<variant>:<n>");
    let n: u64 = n.parse().expect("a request count");
    if variant.ends_with("_put") {
        return put::put_only(policy, variant, n).await;
    }
    #[cfg(feature = "opentelemetry")]
    if variant == "layer_metrics" || variant == "otel_floor" {
        return metrics_only(variant, n).await;
    }
    if variant.starts_with("deadline_") {
        return deadline_only(variant, n).await;
    }
    if variant.starts_with("header_") {
        return header_floor(variant, n).await;
    }
    for _ in 0..n {
        match variant {
            "bare" => one(&mut s.bare, Kind::Get).await,
            "tower_retry" => one(&mut s.tower_retry, Kind::Get).await,
            "floor" => one(&mut s.floor, Kind::Get).await,
            "layer" => one(&mut s.layer, Kind::Get).await,
            "layer_post" => one(&mut s.layer, Kind::Post).await,
            "layer_no_budget" => one(&mut s.layer_no_budget, Kind::Get).await,
            "layer_tps" => one(&mut s.layer_tps, Kind::Get).await,
            "layer_spans_off" => {
                let _off = tracing::subscriber::set_default(spans_off());
                one(&mut s.layer, Kind::Get).await
            }
            other => panic!("unknown variant {other}"),
        }
    }
}

/// `OVERHEAD_ONLY=deadline_<kind>:<n>`: `n` GETs with a deadline of the policy's own
/// (`deadline_own`), the same handing it on to the host (`deadline_sent`: the host matched,
/// the attempt's wait and number written), the same inside a handler's inbound deadline
/// (`deadline_carried`: the inbound deadline read too), and a policy that inherits nothing
/// outside any scope
/// (`deadline_off`, against the default's `layer`: what reading the task-local costs).
async fn deadline_only(variant: &str, n: u64) {
    use tower_retry_safety::deadline::{self, Inbound};
    let own = || RetryPolicy::builder().deadline(Duration::from_secs(30));
    let policy = match variant {
        "deadline_own" => own().build(),
        "deadline_carried" => own().send_deadline_to("api.example.com").build(),
        "deadline_sent" => own().send_deadline_to("api.example.com").build(),
        "deadline_off" => RetryPolicy::builder().inherit_deadline(None).build(),
        other => panic!("unknown variant {other}"),
    }
    .expect("policy");
    let mut layer = tower::Layer::layer(&policy, Instant200);
    let calls = async move {
        for _ in 0..n {
            one(&mut layer, Kind::Get).await;
        }
    };
    if variant == "deadline_carried" {
        // One scope for the whole run, as a server sets one per handler.
        deadline::scope(Inbound::within(Duration::from_secs(60)), calls).await;
    } else {
        calls.await;
    }
}

/// `OVERHEAD_ONLY=header_<kind>:<n>`: the floor of handing a deadline on, with no layer: `n`
/// GETs into a service that inserts the two headers a deadline takes, their values made once
/// (`header_floor`), against the same service inserting nothing (`header_none`). What any
/// client that sends a deadline pays; this crate's share is what `deadline_sent` costs beyond
/// `deadline_own` and this.
async fn header_floor(variant: &str, n: u64) {
    use http::HeaderValue;
    use tower_retry_safety::deadline::{ATTEMPT_HEADER, TIMEOUT_HEADER};
    let insert = variant == "header_floor";
    let (timeout, attempt) = (HeaderValue::from(29_999u64), HeaderValue::from_static("1"));
    let mut svc = tower::ServiceExt::map_request(
        Instant200,
        move |mut req: retry_safety_testing::bench::Req| {
            if insert {
                let headers = req.headers_mut();
                headers.insert(TIMEOUT_HEADER, std::hint::black_box(&timeout).clone());
                headers.insert(ATTEMPT_HEADER, std::hint::black_box(&attempt).clone());
            }
            req
        },
    );
    for _ in 0..n {
        one(&mut svc, Kind::Get).await;
    }
}

/// `OVERHEAD_ONLY=layer_metrics:<n>`: `n` GETs through a layer recording in an SDK meter.
/// `OVERHEAD_ONLY=otel_floor:<n>`: the SDK's own floor for the same requests, with no layer:
/// one histogram record per request with the attributes the layer gives a plain GET's end
/// (method, verdict source, stop reason, host), built once, into the same SDK: the record
/// alone, the yardstick of this crate's own share.
#[cfg(feature = "opentelemetry")]
async fn metrics_only(variant: &str, n: u64) {
    use opentelemetry::metrics::MeterProvider;
    use opentelemetry::KeyValue;
    use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};

    let reader = PeriodicReader::builder(InMemoryMetricExporter::default())
        .with_interval(Duration::from_secs(3600))
        .build();
    let provider = SdkMeterProvider::builder().with_reader(reader).build();
    let meter = provider.meter("overhead");
    if variant == "otel_floor" {
        let histogram = meter
            .u64_histogram("floor.attempts")
            .with_boundaries(vec![1.0, 2.0, 3.0, 4.0, 5.0])
            .build();
        // Built once: the SDK's record alone, nothing of ours.
        let attributes = [
            KeyValue::new("http.request.method", "GET"),
            KeyValue::new("retry_safety.verdict_source", "method"),
            KeyValue::new("retry_safety.stop_reason", "final"),
            KeyValue::new("server.address", "api.example.com"),
        ];
        for _ in 0..n {
            histogram.record(black_box(1), black_box(&attributes));
        }
    } else {
        let metered = RetryPolicy::builder().meter(meter).build().expect("policy");
        let mut layer = tower::Layer::layer(&metered, Instant200);
        for _ in 0..n {
            one(&mut layer, Kind::Get).await;
        }
    }
    drop(provider);
}
