//! A deadline header sent more than once (two field lines with different values: a proxy
//! that appends its own, a client and a middleware that both set it) is read by its earliest
//! value, or noted as not used: never its first value alone, silently.
//!
//! Found by the adversarial review of issue 48.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use tower::{service_fn, Layer};
use tower_idempotency_keys::deadline::{DeadlineLayer, DEADLINE_NOTE};
use tower_retry_safety::deadline::Inbound;

use super::loopback::{send, serve};

const MAX: Duration = Duration::from_secs(30);

/// The handler answers the time its caller gave it, in whole milliseconds.
fn server() -> std::net::SocketAddr {
    serve(
        DeadlineLayer::new(MAX).layer(service_fn(|req: Request<Incoming>| {
            let left = req
                .extensions()
                .get::<Inbound>()
                .map_or(u128::MAX, |i| i.remaining().as_millis());
            async move { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(left.to_string())))) }
        })),
    )
}

/// Sends `values` of `name`, each on a field line of its own: the time the handler was
/// given, and the notes on the answer.
async fn given(addr: std::net::SocketAddr, name: &str, values: &[&str]) -> (u128, Vec<String>) {
    let mut req = Request::get(format!("http://{addr}/work"));
    for value in values {
        req = req.header(name, *value);
    }
    let (res, body) = send(req.body(Full::new(Bytes::new())).expect("request")).await;
    assert_eq!(res.status(), StatusCode::OK);
    let notes = res
        .headers()
        .get_all(DEADLINE_NOTE)
        .iter()
        .map(|v| v.to_str().expect("ascii").to_owned())
        .collect();
    (body.parse().expect("milliseconds"), notes)
}

/// `request-timeout-ms: 20000` then `request-timeout-ms: 100`: the layer's rule is "the
/// earliest deadline named wins" and "malformed is ignored with a note". Expected: the
/// handler is given at most 100 ms, or the answer notes the header. Found: 20 s and no note
/// — `Conventions::read` reads each header with `HeaderMap::get`, the first field line only;
/// the others are dropped unseen. The same for every convention (`x-stainless-read-timeout`
/// below). Note that the same values joined on one line (`20000, 100`, which RFC 9110 §5.3
/// makes the same field) are noted as malformed: the two spellings of one field are read
/// differently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_deadline_header_is_read_by_its_earliest_value_or_noted() {
    let addr = server();
    for (name, values) in [
        ("request-timeout-ms", ["20000", "100"]),
        ("x-stainless-read-timeout", ["20", "0.1"]),
    ] {
        let (left, notes) = given(addr, name, &values).await;
        assert!(
            left <= 100 || !notes.is_empty(),
            "{name}: {values:?} gave the handler {left} ms, notes {notes:?}"
        );
    }
}
