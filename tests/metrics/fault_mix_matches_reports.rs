//! The client's instruments against the `RetryReport`s of the same requests: the tour's fault
//! mix through the tower layer and through the reqwest adapter, and with hedging. Every count
//! is exact. (With keys end to end, the server layer counting the same stored responses: the
//! end-to-end tests' `metrics/stored_responses_counted_by_each_half.rs`.)

use std::collections::BTreeMap;
use std::time::Duration;

use http::Method;
use retry_safety_testing::fault_server::{Fault, FaultServer};
use retry_safety_testing::meters::{
    fault_mix, fault_mix_policy as policy, Meters, Recorded, FAULT_MIX_PER_ATTEMPT,
};
use tower_retry_safety::{FailureClass, RetryReport, StopReason};

/// Retries of the reports by the class of the attempt each followed: every attempt but the
/// last was followed by a resend (no hedging here).
fn retries_by_class(reports: &[RetryReport]) -> BTreeMap<&'static str, u64> {
    let mut out = BTreeMap::new();
    for report in reports {
        let records: Vec<_> = report.attempt_outcomes().collect();
        for record in &records[..records.len().saturating_sub(1)] {
            *out.entry(record.class().as_str()).or_default() += 1;
        }
    }
    out
}

/// The tour's fault mix through the tower layer: the attempts histogram sums the reports'
/// attempts, each retry is counted once by the class of the attempt it followed, each
/// suppressed write once, and no attribute holds a path, a query or a header value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_mix_through_the_tower_layer_counts_match_the_reports() {
    let meters = Meters::new();
    let server = FaultServer::start().await;
    let policy = policy().meter(meters.meter()).build().expect("policy");
    let reports = fault_mix(policy, &server).await;
    let got = meters.read();
    counts_match(&got, &reports);
    let suppressed = reports.iter().filter(|r| r.retry_suppressed()).count() as u64;
    // Every POST whose first attempt failed (all but the `none` fault), twice over: a 429
    // or a 500 may come after a write too, as far as the client knows.
    assert_eq!(suppressed, 10, "{reports:#?}");
}

/// The client's instruments against the reports of the same requests (no hedging), exactly;
/// and no attribute holds a path, a query or a header value.
fn counts_match(got: &Recorded, reports: &[RetryReport]) {
    let attempts: u64 = reports.iter().map(|r| u64::from(r.attempts())).sum();
    assert_eq!(
        got.u64_histogram("retry_safety.client.attempts"),
        (reports.len() as u64, attempts),
        "one point per request, summing its attempts"
    );
    assert_eq!(got.unit("retry_safety.client.attempts"), "{attempt}");

    let expected = retries_by_class(reports);
    for class in [
        FailureClass::NotSent,
        FailureClass::Ambiguous,
        FailureClass::RetryableResponse,
        FailureClass::Final,
    ] {
        let class = class.as_str();
        assert_eq!(
            got.sum_where(
                "retry_safety.client.retries",
                "retry_safety.failure_class",
                class
            ),
            expected.get(class).copied().unwrap_or(0),
            "retries after a {class} attempt"
        );
    }
    let retries: u64 = expected.values().sum();
    assert_eq!(got.total("retry_safety.client.retries"), retries);
    assert!(retries > 0, "the fault mix retries reads");
    // Every retry waited a decided backoff first.
    assert_eq!(
        got.f64_histogram("retry_safety.client.retry.wait").0,
        retries
    );
    assert_eq!(got.unit("retry_safety.client.retry.wait"), "s");

    let suppressed = reports.iter().filter(|r| r.retry_suppressed()).count() as u64;
    assert_eq!(
        got.total("retry_safety.client.writes.suppressed"),
        suppressed
    );
    for (attributes, _) in got.sums("retry_safety.client.writes.suppressed") {
        assert_eq!(attributes["http.request.method"], "POST");
        assert_eq!(attributes["retry_safety.verdict_source"], "method");
    }
    let refused = reports
        .iter()
        .filter(|r| {
            matches!(
                r.stop_reason(),
                StopReason::Budget
                    | StopReason::Deadline
                    | StopReason::BodyNotReplayable
                    | StopReason::RetryAfterTooLong
            )
        })
        .count() as u64;
    assert_eq!(got.total("retry_safety.client.retries.refused"), refused);
    assert_eq!(got.total("retry_safety.client.stored_responses"), 0);
    assert_eq!(got.total("retry_safety.client.hedges"), 0);

    attributes_are_bounded(got);
}

/// Every point names the server and holds only the bounded attributes: no path, no query,
/// no header value.
fn attributes_are_bounded(got: &Recorded) {
    for (name, attributes) in got.all_attributes() {
        assert_eq!(
            attributes.get("server.address").map(String::as_str),
            Some("127.0.0.1"),
            "{name}"
        );
        for (key, value) in &attributes {
            assert!(
                !value.contains('/') && !value.contains("s3cr3t") && !value.contains("hunter2"),
                "{name}: {key}={value} holds a path, a query or a header value"
            );
            assert!(
                [
                    "http.request.method",
                    "server.address",
                    "retry_safety.verdict_source",
                    "retry_safety.failure_class",
                    "retry_safety.stop_reason",
                ]
                .contains(&key.as_str()),
                "{name}: unexpected attribute {key}"
            );
        }
    }
}

/// The same fault mix through the reqwest-middleware adapter: the same instruments, counted
/// from the same decision core, match its reports exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_mix_through_the_reqwest_adapter_counts_match_the_reports() {
    let meters = Meters::new();
    let server = FaultServer::start().await;
    let policy = policy().meter(meters.meter()).build().expect("policy");
    let client = reqwest_middleware::ClientBuilder::new(
        reqwest::Client::builder()
            .timeout(FAULT_MIX_PER_ATTEMPT)
            .build()
            .expect("reqwest client"),
    )
    .with(tower_retry_safety::RetrySafetyMiddleware::new(policy))
    .build();
    let mut tasks = tokio::task::JoinSet::new();
    for round in 0..2 {
        for (i, fault) in Fault::ALL.into_iter().enumerate() {
            for method in [Method::GET, Method::POST] {
                let url = server.url(&format!("{method}-{i}-{round}?token=s3cr3t"));
                let client = client.clone();
                tasks.spawn(async move {
                    let sent = client
                        .request(method, &url)
                        .header("x-fault", fault.name())
                        .header("x-secret-header", "hunter2")
                        .body("{}")
                        .send()
                        .await;
                    match sent {
                        Ok(res) => RetryReport::of_reqwest(&res)
                            .cloned()
                            .expect("the adapter adds a report"),
                        Err(reqwest_middleware::Error::Middleware(err)) => err
                            .downcast_ref::<tower_retry_safety::Error>()
                            .and_then(|e| e.report().cloned())
                            .expect("the adapter's error has a report"),
                        Err(other) => panic!("not the adapter's error: {other}"),
                    }
                });
            }
        }
    }
    let mut reports = Vec::new();
    while let Some(report) = tasks.join_next().await {
        reports.push(report.expect("the request's task"));
    }
    let got = meters.read();
    counts_match(&got, &reports);
    assert_eq!(
        got.total("retry_safety.client.writes.suppressed"),
        10,
        "{reports:#?}"
    );
}

/// Hedging: hedges sent, hedges that won and attempts superseded are counted as the reports
/// have them, and the attempts histogram still sums the reports' attempts (the superseded
/// included).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hedges_are_counted_as_the_reports_have_them() {
    let meters = Meters::new();
    let server = FaultServer::start().await;
    let policy = policy()
        .hedge(tower_retry_safety::Hedge::fixed(Duration::from_millis(20)).max_extra_load(0.5))
        .meter(meters.meter())
        .build()
        .expect("policy");
    let reports = fault_mix(policy, &server).await;
    let got = meters.read();
    let sum = |f: fn(&RetryReport) -> u64| reports.iter().map(f).sum::<u64>();
    let hedges = sum(|r| u64::from(r.hedges()));
    assert!(hedges > 0, "the slow reads are hedged: {reports:#?}");
    assert_eq!(got.total("retry_safety.client.hedges"), hedges);
    assert_eq!(
        got.total("retry_safety.client.hedge.wins"),
        sum(|r| u64::from(r.won_by().is_some_and(|n| n > 1)))
    );
    assert_eq!(
        got.total("retry_safety.client.attempts.superseded"),
        sum(|r| u64::from(r.superseded()))
    );
    assert_eq!(
        got.u64_histogram("retry_safety.client.attempts"),
        (reports.len() as u64, sum(|r| u64::from(r.attempts())))
    );
    // Every resend is a retry or a hedge.
    assert_eq!(
        got.total("retry_safety.client.retries") + hedges,
        sum(|r| u64::from(r.attempts() - 1))
    );
}
