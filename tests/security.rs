//! Nothing secret leaks: no query string, body byte or header value other than the request id
//! and the idempotency key appears in an error's Display or Debug, a report, or a tracing
//! event; those two are capped in length wherever they are echoed.

mod support;

use std::time::Duration;

use http::Request;
use support::logs::{block_on, capture};
use support::script::{status, Outcome, Reset, Script, Timeout};
use tower::{Layer, ServiceExt};
use tower_retry_safety::{RetryPolicy, RetryReport};

const SECRETS: [&str; 5] = [
    "QUERYSECRET",
    "BODYSECRET",
    "AUTHSECRET",
    "COOKIESECRET",
    "CUSTOMSECRET",
];

fn request(method: &str, request_id: &str, key: &str) -> Request<String> {
    Request::builder()
        .method(method)
        .uri("http://api.test/v1/tools/execute?token=QUERYSECRET&x=1")
        .header("authorization", "Bearer AUTHSECRET")
        .header("cookie", "session=COOKIESECRET")
        .header("x-custom", "CUSTOMSECRET")
        .header("x-request-id", request_id)
        .header("idempotency-key", key)
        .body("{\"card\":\"BODYSECRET\"}".to_owned())
        .unwrap()
}

fn everything_echoed(method: &str, request_id: &str, key: &str, script: Vec<Outcome>) -> String {
    let policy = RetryPolicy::builder()
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .build()
        .unwrap();
    let (logs, text) = capture(|| {
        block_on(async {
            let out = policy
                .layer(Script::new(script))
                .oneshot(request(method, request_id, key))
                .await;
            match out {
                Ok(res) => format!("{:?}", res.extensions().get::<RetryReport>().unwrap()),
                Err(e) => format!("{e}\n{e:?}\n{:?}", e.report().unwrap()),
            }
        })
    });
    format!("{text}\n{logs}")
}

#[test]
fn no_secret_in_errors_reports_or_events() {
    let cases: [(&str, Vec<Outcome>); 4] = [
        ("POST", vec![Timeout]),
        ("POST", vec![status(503)]),
        ("GET", vec![Reset, Reset, Reset]),
        ("GET", vec![status(503), status(200)]),
    ];
    for (method, script) in cases {
        let all = everything_echoed(method, "req-1", "\"key-1\"", script.clone());
        for secret in SECRETS {
            assert!(
                !all.contains(secret),
                "{secret} leaked ({method} {script:?}):\n{all}"
            );
        }
        assert!(all.contains("req-1"), "the request id is echoed:\n{all}");
    }
}

#[test]
fn request_id_and_key_are_capped() {
    let long_id = "i".repeat(1000);
    let all = everything_echoed("POST", &long_id, "\"k\"", vec![Timeout]);
    assert!(all.contains(&"i".repeat(128)), "{all}");
    assert!(
        !all.contains(&"i".repeat(129)),
        "a request id longer than 128 bytes was echoed"
    );

    // A key longer than 255 bytes is malformed: it is never echoed at all.
    let long_key = format!("\"{}\"", "k".repeat(400));
    let all = everything_echoed("POST", "r", &long_key, vec![Timeout]);
    assert!(
        !all.contains(&"k".repeat(256)),
        "an over-long key was echoed"
    );
    let key = format!("\"{}\"", "k".repeat(253));
    let all = everything_echoed("POST", "r", &key, vec![Timeout]);
    assert!(all.contains(&"k".repeat(253)));
}

#[test]
fn a_request_id_with_control_or_non_ascii_bytes_is_not_echoed() {
    let policy = RetryPolicy::builder().build().unwrap();
    let mut req = request("POST", "x", "\"k\"");
    req.headers_mut().insert(
        "x-request-id",
        http::HeaderValue::from_bytes(b"caf\xc3\xa9\tid").unwrap(),
    );
    let err = block_on(policy.layer(Script::new([Timeout])).oneshot(req)).unwrap_err();
    assert_eq!(err.request_id(), None);
}
