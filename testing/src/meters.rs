//! The metrics tests' harness (the `metrics` feature): a meter provider whose instruments are
//! read back through the SDK's in-memory exporter, and the hyper client and request the
//! client-side tests send to the fault server, and the tour's fault mix through the layer.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::fault_server::{Fault, FaultServer};
use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use opentelemetry::metrics::{Meter, MeterProvider};
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, Metric, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use tower::{ServiceBuilder, ServiceExt};
use tower_retry_safety::{Idempotency, RetryPolicy, RetryReport};

/// A meter provider whose metrics are read back from memory.
pub struct Meters {
    provider: SdkMeterProvider,
    exporter: InMemoryMetricExporter,
}

impl Default for Meters {
    fn default() -> Meters {
        Meters::new()
    }
}

impl Meters {
    pub fn new() -> Meters {
        let exporter = InMemoryMetricExporter::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter.clone()).build())
            .build();
        Meters { provider, exporter }
    }

    pub fn meter(&self) -> Meter {
        self.provider.meter("tower-retry-safety")
    }

    /// Everything recorded so far (cumulative).
    pub fn read(&self) -> Recorded {
        self.provider.force_flush().expect("flush");
        let mut all = self.exporter.get_finished_metrics().expect("metrics");
        Recorded(all.pop().expect("one export after the flush"))
    }
}

pub struct Recorded(ResourceMetrics);

pub type Attributes = BTreeMap<String, String>;

impl Recorded {
    fn metric(&self, name: &str) -> Option<&Metric> {
        self.0
            .scope_metrics()
            .flat_map(|s| s.metrics())
            .find(|m| m.name() == name)
    }

    pub fn unit(&self, name: &str) -> String {
        self.metric(name)
            .map(|m| m.unit().to_owned())
            .unwrap_or_default()
    }

    /// A counter's value per attribute set (empty when nothing was recorded).
    pub fn sums(&self, name: &str) -> Vec<(Attributes, u64)> {
        let Some(metric) = self.metric(name) else {
            return Vec::new();
        };
        match metric.data() {
            AggregatedMetrics::U64(MetricData::Sum(sum)) => sum
                .data_points()
                .map(|p| (attributes(p.attributes()), p.value()))
                .collect(),
            other => panic!("{name} is not a u64 sum: {other:?}"),
        }
    }

    /// A counter's total over the points whose attribute `key` is `value`.
    pub fn sum_where(&self, name: &str, key: &str, value: &str) -> u64 {
        self.sums(name)
            .iter()
            .filter(|(a, _)| a.get(key).map(String::as_str) == Some(value))
            .map(|(_, v)| v)
            .sum()
    }

    pub fn total(&self, name: &str) -> u64 {
        self.sums(name).iter().map(|(_, v)| v).sum()
    }

    /// A u64 histogram's (count, sum) over all its points.
    pub fn u64_histogram(&self, name: &str) -> (u64, u64) {
        let Some(metric) = self.metric(name) else {
            return (0, 0);
        };
        match metric.data() {
            AggregatedMetrics::U64(MetricData::Histogram(h)) => h
                .data_points()
                .fold((0, 0), |(c, s), p| (c + p.count(), s + p.sum())),
            other => panic!("{name} is not a u64 histogram: {other:?}"),
        }
    }

    /// An f64 histogram's (count, sum) over all its points.
    pub fn f64_histogram(&self, name: &str) -> (u64, f64) {
        let Some(metric) = self.metric(name) else {
            return (0, 0.0);
        };
        match metric.data() {
            AggregatedMetrics::F64(MetricData::Histogram(h)) => h
                .data_points()
                .fold((0, 0.0), |(c, s), p| (c + p.count(), s + p.sum())),
            other => panic!("{name} is not an f64 histogram: {other:?}"),
        }
    }

    /// Every attribute set recorded, in every instrument.
    pub fn all_attributes(&self) -> Vec<(String, Attributes)> {
        let mut out = Vec::new();
        for metric in self.0.scope_metrics().flat_map(|s| s.metrics()) {
            let name = metric.name().to_owned();
            let sets: Vec<Attributes> = match metric.data() {
                AggregatedMetrics::U64(MetricData::Sum(s)) => s
                    .data_points()
                    .map(|p| attributes(p.attributes()))
                    .collect(),
                AggregatedMetrics::U64(MetricData::Histogram(h)) => h
                    .data_points()
                    .map(|p| attributes(p.attributes()))
                    .collect(),
                AggregatedMetrics::F64(MetricData::Histogram(h)) => h
                    .data_points()
                    .map(|p| attributes(p.attributes()))
                    .collect(),
                other => panic!("{name}: unexpected data {other:?}"),
            };
            out.extend(sets.into_iter().map(|a| (name.clone(), a)));
        }
        out
    }

    /// A u64 histogram's count per attribute set.
    pub fn u64_histogram_points(&self, name: &str) -> Vec<(Attributes, u64)> {
        let Some(metric) = self.metric(name) else {
            return Vec::new();
        };
        match metric.data() {
            AggregatedMetrics::U64(MetricData::Histogram(h)) => h
                .data_points()
                .map(|p| (attributes(p.attributes()), p.count()))
                .collect(),
            other => panic!("{name} is not a u64 histogram: {other:?}"),
        }
    }
}

fn attributes<'a>(kvs: impl Iterator<Item = &'a opentelemetry::KeyValue>) -> Attributes {
    kvs.map(|kv| (kv.key.as_str().to_owned(), kv.value.as_str().into_owned()))
        .collect()
}

pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

pub fn request(method: Method, url: &str, fault: Fault) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(url)
        .header("x-fault", fault.name())
        .header("x-secret-header", "hunter2")
        .body(Full::new(Bytes::from_static(b"{\"to\":\"a@example.com\"}")))
        .expect("a valid request")
}

/// Well under the fault server's 800 ms slow response, well over a loaded machine's round trip.
pub const FAULT_MIX_PER_ATTEMPT: Duration = Duration::from_millis(400);

/// The fault mix's policy: three retries, quick backoff, a POST search route that is a read.
pub fn fault_mix_policy() -> tower_retry_safety::RetryPolicyBuilder {
    RetryPolicy::builder()
        .max_retries(3)
        .backoff(Duration::from_millis(5), Duration::from_millis(50))
        .route(Method::POST, "/ops/{op}/search", Idempotency::Idempotent)
        .no_budget()
}

/// The tour's fault mix: sends a GET and a POST per fault (twice over) through the tower layer with `policy`, and
/// returns every request's report.
pub async fn fault_mix(policy: RetryPolicy, server: &FaultServer) -> Vec<RetryReport> {
    let svc = ServiceBuilder::new()
        .layer(policy)
        .timeout(FAULT_MIX_PER_ATTEMPT)
        .service(client());
    let mut tasks = tokio::task::JoinSet::new();
    for round in 0..2 {
        for (i, fault) in Fault::ALL.into_iter().enumerate() {
            for method in [Method::GET, Method::POST] {
                let url = server.url(&format!("{method}-{i}-{round}?token=s3cr3t"));
                let svc = svc.clone();
                tasks.spawn(async move {
                    match svc.oneshot(request(method, &url, fault)).await {
                        Ok(res) => {
                            let report = RetryReport::of(&res).cloned();
                            let _ = res.into_body().collect().await;
                            report.expect("the layer adds a report")
                        }
                        Err(err) => err
                            .report()
                            .cloned()
                            .expect("the layer's error has a report"),
                    }
                });
            }
        }
    }
    let mut reports = Vec::new();
    while let Some(report) = tasks.join_next().await {
        reports.push(report.expect("the request's task"));
    }
    assert_eq!(reports.len(), 2 * 2 * Fault::ALL.len());
    reports
}
