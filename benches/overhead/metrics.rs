//! The layer recording in an SDK meter against the same policy without one, interleaved.

use std::time::{Duration, Instant};

use tower_retry_safety::RetryPolicy;

use super::{one, Instant200, Kind, Variant};
use retry_safety_testing::bench::{median, print_ratio};

/// The layer recording in an SDK meter (the OpenTelemetry SDK's own aggregation, a reader
/// that does not export during the run) against the same policy without a meter,
/// interleaved. Run with `--features opentelemetry`.
pub(crate) async fn metrics_overhead() {
    use opentelemetry::metrics::MeterProvider;
    use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};

    let reader = PeriodicReader::builder(InMemoryMetricExporter::default())
        .with_interval(Duration::from_secs(3600))
        .build();
    let provider = SdkMeterProvider::builder().with_reader(reader).build();
    let plain = RetryPolicy::builder().build().expect("policy");
    let metered = RetryPolicy::builder()
        .meter(provider.meter("overhead"))
        .build()
        .expect("policy");
    let mut layer = tower::Layer::layer(&plain, Instant200);
    let mut layer_metrics = tower::Layer::layer(&metered, Instant200);
    let mut v = ["layer_get", "layer_get_metrics"].map(Variant::new);
    for _ in 0..50_000 {
        one(&mut layer, Kind::Get).await;
        one(&mut layer_metrics, Kind::Get).await;
    }
    v[0].allocs = count_allocs!(layer, Kind::Get);
    v[1].allocs = count_allocs!(layer_metrics, Kind::Get);
    let deadline = Instant::now() + Duration::from_secs(30);
    for _ in 0..201 {
        measure!(v[0], 2_000, layer, Kind::Get);
        measure!(v[1], 2_000, layer_metrics, Kind::Get);
        if Instant::now() > deadline {
            break;
        }
    }
    let samples: Vec<Vec<f64>> = v.iter().map(|x| x.samples.clone()).collect();
    let med: Vec<f64> = v.iter_mut().map(|x| median(&mut x.samples)).collect();
    print_ratio(
        "layer_get_metrics/layer_get",
        &samples[1],
        &samples[0],
        &format!(" (+{:.0} ns per request)", med[1] - med[0]),
    );
    println!("allocs layer_get_metrics {}", v[1].allocs - v[0].allocs);
    drop(provider);
}
