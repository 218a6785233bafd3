//! One span per attempt, captured by a real `tracing` subscriber: OpenTelemetry's HTTP names,
//! the crate's decisions, `follows_from` links, and spans further in parented to the attempt.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use tower::{service_fn, Layer, ServiceExt};
use tower_retry_safety::service::attempt_number;
use tower_retry_safety::{Hedge, RetryPolicy};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

#[derive(Debug, Default, Clone)]
struct Captured {
    id: u64,
    name: &'static str,
    parent: Option<u64>,
    fields: BTreeMap<String, String>,
    follows: Vec<u64>,
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Captured>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut c = Captured {
            id: id.into_u64(),
            name: attrs.metadata().name(),
            parent: attrs
                .parent()
                .cloned()
                .or_else(|| ctx.current_span().id().cloned())
                .map(|p| p.into_u64()),
            ..Default::default()
        };
        attrs.record(&mut Fields(&mut c.fields));
        self.0.lock().unwrap().push(c);
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut spans = self.0.lock().unwrap();
        if let Some(c) = spans.iter_mut().find(|c| c.id == id.into_u64()) {
            values.record(&mut Fields(&mut c.fields));
        }
    }
    fn on_follows_from(&self, id: &Id, follows: &Id, _: Context<'_, S>) {
        let mut spans = self.0.lock().unwrap();
        if let Some(c) = spans.iter_mut().find(|c| c.id == id.into_u64()) {
            c.follows.push(follows.into_u64());
        }
    }
}

/// Runs `f` with the capturing subscriber; the attempt spans and the inner ones.
async fn capture<F: std::future::Future<Output = ()>>(f: F) -> (Vec<Captured>, Vec<Captured>) {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    retry_safety_testing::spans::keep_interest_per_event();
    let guard = tracing::subscriber::set_default(subscriber);
    f.await;
    drop(guard);
    let spans = capture.0.lock().unwrap().clone();
    spans.into_iter().partition(|c| c.name == "HTTP attempt")
}

/// An inner service that opens its own span (as tower-http's `trace` would) tagged with the
/// attempt number read from the extensions, and answers from `script(attempt)`.
async fn send(
    policy: RetryPolicy,
    req: Request<String>,
    script: fn(u32) -> (u64, u16),
) -> Response<String> {
    let svc = policy.layer(service_fn(move |req: Request<String>| {
        let n = attempt_number(req.extensions()).unwrap_or(0);
        let span = tracing::info_span!("inner", attempt = n);
        async move {
            let _e = span.enter();
            let (ms, status) = script(n);
            drop(_e);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok::<_, std::io::Error>(
                Response::builder()
                    .status(status)
                    .body(String::new())
                    .unwrap(),
            )
        }
    }));
    svc.oneshot(req).await.unwrap()
}

fn get(f: &Captured, k: &str) -> Option<String> {
    f.fields.get(k).cloned()
}

#[tokio::test(start_paused = true)]
async fn a_retry_is_a_second_span_following_the_first() {
    let policy = RetryPolicy::builder()
        .backoff(Duration::from_millis(1), Duration::from_millis(1))
        .build()
        .unwrap();
    let req = Request::get("http://api.example/items?token=secret")
        .body(String::new())
        .unwrap();
    let (spans, inner) = capture(async {
        send(policy, req, |n| (1, if n == 1 { 503 } else { 200 })).await;
    })
    .await;
    assert_eq!(spans.len(), 2, "{spans:#?}");
    let (a, b) = (&spans[0], &spans[1]);
    for s in [a, b] {
        assert_eq!(get(s, "http.request.method").as_deref(), Some("GET"));
        assert_eq!(get(s, "otel.name").as_deref(), Some("GET"));
        assert_eq!(get(s, "url.path").as_deref(), Some("/items"));
        assert_eq!(get(s, "server.address").as_deref(), Some("api.example"));
        assert_eq!(
            get(s, "retry_safety.verdict_source").as_deref(),
            Some("method")
        );
        assert_eq!(get(s, "retry_safety.idempotent").as_deref(), Some("true"));
        assert!(
            !format!("{:?}", s.fields).contains("secret"),
            "no query: {s:?}"
        );
    }
    assert_eq!(get(a, "retry_safety.attempt").as_deref(), Some("1"));
    assert_eq!(get(a, "http.request.resend_count"), None);
    assert_eq!(get(a, "http.response.status_code").as_deref(), Some("503"));
    assert_eq!(get(a, "error.type").as_deref(), Some("503"));
    assert_eq!(
        get(a, "retry_safety.failure_class").as_deref(),
        Some("retryable-response")
    );
    assert_eq!(get(a, "retry_safety.decision").as_deref(), Some("retry"));
    assert_eq!(get(b, "retry_safety.attempt").as_deref(), Some("2"));
    assert_eq!(get(b, "http.request.resend_count").as_deref(), Some("1"));
    assert_eq!(get(b, "http.response.status_code").as_deref(), Some("200"));
    assert_eq!(get(b, "error.type"), None);
    assert_eq!(get(b, "retry_safety.decision").as_deref(), Some("final"));
    assert_eq!(b.follows, [a.id]);
    assert!(a.follows.is_empty());
    // The inner service's spans sit inside the attempts and know their number.
    assert_eq!(inner.len(), 2);
    assert_eq!(
        (inner[0].parent, get(&inner[0], "attempt").as_deref()),
        (Some(a.id), Some("1"))
    );
    assert_eq!(
        (inner[1].parent, get(&inner[1], "attempt").as_deref()),
        (Some(b.id), Some("2"))
    );
}

#[tokio::test(start_paused = true)]
async fn a_suppressed_retry_says_why_on_its_span() {
    let policy = RetryPolicy::builder().build().unwrap();
    let req = Request::post("http://api.example/pay")
        .body("{}".to_string())
        .unwrap();
    let (spans, _) = capture(async {
        send(policy, req, |_| (1, 503)).await;
    })
    .await;
    assert_eq!(spans.len(), 1);
    let s = &spans[0];
    assert_eq!(get(s, "http.request.method").as_deref(), Some("POST"));
    assert_eq!(get(s, "retry_safety.idempotent").as_deref(), Some("false"));
    assert_eq!(
        get(s, "retry_safety.decision").as_deref(),
        Some("suppressed-not-idempotent")
    );
    assert_eq!(get(s, "error.type").as_deref(), Some("503"));
}

#[tokio::test(start_paused = true)]
async fn a_hedge_has_its_span_and_the_winner_says_so() {
    let policy = RetryPolicy::builder()
        .hedge(Hedge::fixed(Duration::from_millis(10)).max_extra_load(1.0))
        .build()
        .unwrap();
    let req = Request::get("http://api.example/items")
        .body(String::new())
        .unwrap();
    let (spans, inner) = capture(async {
        send(policy, req, |n| (if n == 1 { 500 } else { 1 }, 200)).await;
    })
    .await;
    assert_eq!(spans.len(), 2, "{spans:#?}");
    let (a, b) = (&spans[0], &spans[1]);
    assert_eq!(get(a, "retry_safety.hedge").as_deref(), Some("false"));
    assert_eq!(get(a, "retry_safety.superseded").as_deref(), Some("true"));
    assert_eq!(get(a, "retry_safety.hedge_won"), None);
    assert_eq!(get(b, "retry_safety.hedge").as_deref(), Some("true"));
    assert_eq!(get(b, "retry_safety.hedge_won").as_deref(), Some("true"));
    assert_eq!(get(b, "http.request.resend_count").as_deref(), Some("1"));
    assert_eq!(get(b, "retry_safety.decision").as_deref(), Some("final"));
    assert_eq!(b.follows, [a.id]);
    assert_eq!(inner[1].parent, Some(b.id));
}

#[tokio::test(start_paused = true)]
async fn a_failed_attempt_names_its_error_type() {
    let policy = RetryPolicy::builder().max_retries(0).build().unwrap();
    let svc = policy.layer(service_fn(|_req: Request<String>| async {
        Err::<Response<String>, _>(std::io::Error::other("reset"))
    }));
    let req = Request::get("http://api.example/items")
        .body(String::new())
        .unwrap();
    let (spans, _) = capture(async {
        let _ = svc.oneshot(req).await;
    })
    .await;
    assert_eq!(spans.len(), 1);
    assert_eq!(get(&spans[0], "error.type").as_deref(), Some("ambiguous"));
    assert_eq!(get(&spans[0], "http.response.status_code"), None);
    assert_eq!(
        get(&spans[0], "retry_safety.decision").as_deref(),
        Some("retries-exhausted")
    );
}

/// The reqwest adapter: a span per attempt too, against the loopback fault server (the first
/// attempt answers 503 after applying; the GET is retried once).
#[cfg(feature = "reqwest-middleware")]
#[tokio::test]
async fn the_reqwest_adapter_opens_a_span_per_attempt() {
    use retry_safety_testing::fault_server::{Fault, FaultServer};

    let server = FaultServer::start().await;
    let policy = RetryPolicy::builder()
        .backoff(Duration::from_millis(1), Duration::from_millis(1))
        .build()
        .unwrap();
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(tower_retry_safety::RetrySafetyMiddleware::new(policy))
        .build();
    let url = format!("{}?token=secret", server.url("read"));
    let (spans, _) = capture(async {
        let res = client
            .get(url)
            .header("x-fault", Fault::UnavailableAfterApply.name())
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
    })
    .await;
    assert_eq!(spans.len(), 2, "{spans:#?}");
    let (a, b) = (&spans[0], &spans[1]);
    assert_eq!(get(a, "url.path").as_deref(), Some("/ops/read"));
    assert_eq!(get(a, "http.response.status_code").as_deref(), Some("503"));
    assert_eq!(get(a, "retry_safety.decision").as_deref(), Some("retry"));
    assert_eq!(get(b, "http.request.resend_count").as_deref(), Some("1"));
    assert_eq!(get(b, "http.response.status_code").as_deref(), Some("200"));
    assert_eq!(b.follows, [a.id]);
    for s in [a, b] {
        assert!(
            !format!("{:?}", s.fields).contains("secret"),
            "no query: {s:?}"
        );
    }
}
