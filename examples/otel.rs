//! The attempt spans as OpenTelemetry sees them: `tracing-opentelemetry` exports the layer's
//! spans to an in-memory exporter, and the example prints each one with its attributes and
//! links. Three requests against the loopback fault server: a GET whose first attempt gets a
//! 503 (retried), a POST whose first attempt gets a 503 (the retry is suppressed), and a slow
//! GET that is hedged. With the feature `opentelemetry`, the policy also records its metrics
//! through an SDK meter, and the example prints them after the spans.
//!
//! Run: `cargo run --example otel` (spans), `cargo run --example otel --features opentelemetry`
//! (spans and metrics)

use retry_safety_testing::fault_server;

use std::time::Duration;

use bytes::Bytes;
use fault_server::{Fault, FaultServer};
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use tower::{Layer, ServiceExt};
use tower_retry_safety::{Hedge, RetryPolicy};
use tracing_subscriber::layer::SubscriberExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("otel-example")));
    tracing::subscriber::set_global_default(subscriber)?;

    let server = FaultServer::start().await;
    let policy = RetryPolicy::builder()
        .backoff(Duration::from_millis(5), Duration::from_millis(5))
        .hedge(Hedge::fixed(Duration::from_millis(20)).max_extra_load(1.0));
    #[cfg(feature = "opentelemetry")]
    let (metrics, policy) = {
        use opentelemetry::metrics::MeterProvider as _;
        let exporter = opentelemetry_sdk::metrics::InMemoryMetricExporter::default();
        let reader = opentelemetry_sdk::metrics::PeriodicReader::builder(exporter.clone()).build();
        let provider = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
            .with_reader(reader)
            .build();
        let meter = provider.meter("otel-example");
        ((provider, exporter), policy.meter(meter))
    };
    let policy = policy.build()?;
    let svc = policy.layer(Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>());
    let requests = [
        (Method::GET, "retried", Fault::UnavailableAfterApply),
        (Method::POST, "suppressed", Fault::UnavailableAfterApply),
        (Method::GET, "hedged", Fault::SlowAfterApply),
    ];
    for (method, op, fault) in requests {
        let req = Request::builder()
            .method(method)
            .uri(format!("{}?token=never-exported", server.url(op)))
            .header("x-fault", fault.name())
            .body(Full::new(Bytes::from_static(b"{}")))?;
        let res = svc.clone().oneshot(req).await?;
        println!("{op}: {}", res.status());
        res.into_body().collect().await?;
    }

    provider.force_flush()?;
    let mut spans = exporter.get_finished_spans()?;
    spans.sort_by_key(|s| s.start_time);
    println!("\n{} spans exported:", spans.len());
    for s in &spans {
        println!(
            "\n{} ({:?}), {} link(s) to earlier attempts",
            s.name,
            s.span_kind,
            s.links.links.len()
        );
        for kv in &s.attributes {
            println!("  {} = {}", kv.key, kv.value);
        }
    }
    #[cfg(feature = "opentelemetry")]
    print_metrics(&metrics.0, &metrics.1)?;
    Ok(())
}

/// Every data point the policy recorded, with its attributes.
#[cfg(feature = "opentelemetry")]
fn print_metrics(
    provider: &opentelemetry_sdk::metrics::SdkMeterProvider,
    exporter: &opentelemetry_sdk::metrics::InMemoryMetricExporter,
) -> Result<(), Box<dyn std::error::Error>> {
    use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};

    provider.force_flush()?;
    let exported = exporter.get_finished_metrics()?;
    let Some(last) = exported.last() else {
        return Ok(());
    };
    println!("\nmetrics:");
    let show = |kvs: &mut dyn Iterator<Item = &opentelemetry::KeyValue>| {
        kvs.map(|kv| format!("{}={}", kv.key, kv.value))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for metric in last.scope_metrics().flat_map(|s| s.metrics()) {
        println!("\n{} ({})", metric.name(), metric.unit());
        match metric.data() {
            AggregatedMetrics::U64(MetricData::Sum(sum)) => {
                for p in sum.data_points() {
                    println!("  {} [{}]", p.value(), show(&mut p.attributes()));
                }
            }
            AggregatedMetrics::U64(MetricData::Histogram(h)) => {
                for p in h.data_points() {
                    let (count, sum) = (p.count(), p.sum());
                    println!("  count {count}, sum {sum} [{}]", show(&mut p.attributes()));
                }
            }
            AggregatedMetrics::F64(MetricData::Histogram(h)) => {
                for p in h.data_points() {
                    let (count, sum) = (p.count(), p.sum());
                    println!(
                        "  count {count}, sum {sum:.3} [{}]",
                        show(&mut p.attributes())
                    );
                }
            }
            _ => {}
        }
    }
    Ok(())
}
