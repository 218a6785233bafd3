//! What each attempt hands on of its deadline, over real sockets on loopback (issue 48): the
//! time the client waits for *that* attempt, in every convention a host may read, on resends
//! and hedges alike; never to a host a redirect points at, nor stale; and carried across the
//! tasks a handler's work runs in (a `Buffer`'s worker, a spawned task). The servers keep
//! every request's headers; the values are checked against what the client waits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tower::{service_fn, Layer, ServiceBuilder, ServiceExt};
use tower_retry_safety::deadline::{
    self, Convention, Inbound, InheritDeadline, ATTEMPT_HEADER, CONNECT_TIMEOUT_HEADER,
    ENVOY_ATTEMPT_HEADER, ENVOY_TIMEOUT_HEADER, TIMEOUT_HEADER,
};
use tower_retry_safety::{Hedge, RetryPolicy, RetryPolicyBuilder};

use retry_safety_testing::runtime_server::{accept, listener};

/// Each request's headers, by path.
type Seen = Arc<Mutex<HashMap<String, Vec<HeaderMap>>>>;

/// A server on loopback that keeps each request's headers by path, then: `/hold` answers
/// after a minute (the client gives up first), `/redirect` answers `307` to the `to` query's
/// URL after 300 ms, anything else `200` at once.
fn server() -> (std::net::SocketAddr, Seen) {
    let (socket, addr) = listener();
    let seen = Seen::default();
    let kept = seen.clone();
    let svc = service_fn(move |req: Request<Incoming>| {
        let path = req.uri().path().to_owned();
        kept.lock()
            .expect("headers")
            .entry(path.clone())
            .or_default()
            .push(req.headers().clone());
        let to = req
            .uri()
            .query()
            .and_then(|q| q.strip_prefix("to="))
            .map(str::to_owned);
        async move {
            match (path.as_str(), to) {
                ("/hold", _) => {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    Response::builder().body(Empty::<Bytes>::new())
                }
                ("/redirect", Some(to)) => {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Response::builder()
                        .status(StatusCode::TEMPORARY_REDIRECT)
                        .header("location", to)
                        .body(Empty::new())
                }
                _ => Response::builder().body(Empty::new()),
            }
        }
    });
    tokio::spawn(accept(socket, svc));
    (addr, seen)
}

fn headers_of(seen: &Seen, path: &str) -> Vec<HeaderMap> {
    seen.lock()
        .expect("headers")
        .get(path)
        .cloned()
        .unwrap_or_default()
}

fn millis(headers: &HeaderMap, name: &HeaderName) -> u64 {
    headers[name]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("milliseconds")
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

fn get(url: &str) -> Request<Full<Bytes>> {
    Request::get(url)
        .body(Full::new(Bytes::new()))
        .expect("request")
}

/// A policy whose call may last 3 s but whose attempts are each cut at 150 ms.
fn per_attempt(addr: std::net::SocketAddr) -> RetryPolicyBuilder {
    RetryPolicy::builder()
        .deadline(Duration::from_secs(3))
        .attempt_timeout(Duration::from_millis(150))
        .backoff(Duration::from_millis(1), Duration::from_millis(2))
        .max_retries(2)
        .send_deadline_to(&addr.to_string())
        .no_budget()
}

/// Every attempt carries the time the client waits for it (its 150 ms attempt timeout, not
/// the call's 3 s left), and its number. Before: 2999, 2846, 2692 ms for attempts cut at
/// 150 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_resend_carries_the_time_the_client_waits_for_it() {
    let (addr, seen) = server();
    let svc = per_attempt(addr).build().expect("policy").layer(client());
    let err = svc
        .oneshot(get(&format!("http://{addr}/hold")))
        .await
        .expect_err("every attempt is cut");
    assert_eq!(err.attempts(), 3, "{err}");
    let sent = headers_of(&seen, "/hold");
    assert_eq!(sent.len(), 3);
    for (i, headers) in sent.iter().enumerate() {
        let ms = millis(headers, &TIMEOUT_HEADER);
        assert!(ms <= 150, "attempt {}: {ms} ms on the wire", i + 1);
        assert_eq!(headers[ATTEMPT_HEADER], (i + 1).to_string());
    }
}

/// The reqwest front end writes the same values. Before: 2999, 2846, 2692 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_reqwest_resend_carries_the_time_the_client_waits_for_it() {
    let (addr, seen) = server();
    let policy = per_attempt(addr).build().expect("policy");
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(tower_retry_safety::RetrySafetyMiddleware::new(policy))
        .build();
    let err = client
        .get(format!("http://{addr}/hold"))
        .send()
        .await
        .expect_err("every attempt is cut");
    let err = tower_retry_safety::Error::from_reqwest_middleware(&err).expect("our error");
    assert_eq!(err.attempts(), 3, "{err}");
    let sent = headers_of(&seen, "/hold");
    assert_eq!(sent.len(), 3);
    for headers in &sent {
        let ms = millis(headers, &TIMEOUT_HEADER);
        assert!(ms <= 150, "{ms} ms on the wire");
    }
}

/// A hedge carries the time the client waits for it too, and its own number. Before: each
/// carried the call's time left (about 3 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedge_carries_the_time_the_client_waits_for_it() {
    let (addr, seen) = server();
    let policy = per_attempt(addr)
        .hedge(
            Hedge::fixed(Duration::from_millis(20))
                .max_extra_load(1.0)
                .max_hedges(1),
        )
        .build()
        .expect("policy");
    let _ = policy
        .layer(client())
        .oneshot(get(&format!("http://{addr}/hold")))
        .await;
    let sent = headers_of(&seen, "/hold");
    assert!(
        sent.len() >= 2,
        "a first attempt and its hedge: {}",
        sent.len()
    );
    for headers in &sent {
        let ms = millis(headers, &TIMEOUT_HEADER);
        assert!(ms <= 150, "{ms} ms on the wire");
    }
    let numbers: Vec<_> = sent.iter().map(|h| h[ATTEMPT_HEADER].clone()).collect();
    assert!(
        numbers.contains(&"2".parse().expect("value")),
        "{numbers:?}"
    );
}

/// Without a deadline, the attempt timeout alone is how long the client waits: it goes on
/// the wire. Before: nothing did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_timeout_alone_goes_on_the_wire() {
    let (addr, seen) = server();
    let policy = RetryPolicy::builder()
        .attempt_timeout(Duration::from_millis(150))
        .max_retries(0)
        .send_deadline_to(&addr.to_string())
        .build()
        .expect("policy");
    let _ = policy
        .layer(client())
        .oneshot(get(&format!("http://{addr}/hold")))
        .await;
    let sent = headers_of(&seen, "/hold");
    assert_eq!(sent.len(), 1);
    assert!(millis(&sent[0], &TIMEOUT_HEADER) <= 150);
}

/// Each host gets the convention its server reads, and only that one: Envoy's headers,
/// Connect's (no attempt number), this crate's by default. Before: no choice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_host_gets_the_convention_it_reads() {
    let (envoy, envoy_seen) = server();
    let (connect, connect_seen) = server();
    let (own, own_seen) = server();
    let policy = RetryPolicy::builder()
        .deadline(Duration::from_secs(2))
        .send_deadline_to_as(&envoy.to_string(), Convention::Envoy)
        .send_deadline_to_as(&connect.to_string(), Convention::Connect)
        .send_deadline_to(&own.to_string())
        .build()
        .expect("policy");
    let svc = policy.layer(client());
    for addr in [envoy, connect, own] {
        let res = svc
            .clone()
            .oneshot(get(&format!("http://{addr}/ok")))
            .await
            .expect("a response");
        let _ = res.into_body().collect().await;
    }
    let all = [
        TIMEOUT_HEADER,
        ATTEMPT_HEADER,
        ENVOY_TIMEOUT_HEADER,
        ENVOY_ATTEMPT_HEADER,
        CONNECT_TIMEOUT_HEADER,
    ];
    let names = |seen: &Seen| -> Vec<HeaderName> {
        let headers = &headers_of(seen, "/ok")[0];
        all.iter()
            .filter(|n| headers.contains_key(*n))
            .cloned()
            .collect()
    };
    assert_eq!(
        names(&envoy_seen),
        [ENVOY_TIMEOUT_HEADER, ENVOY_ATTEMPT_HEADER]
    );
    assert_eq!(names(&connect_seen), [CONNECT_TIMEOUT_HEADER]);
    assert_eq!(names(&own_seen), [TIMEOUT_HEADER, ATTEMPT_HEADER]);
    assert!(millis(&headers_of(&envoy_seen, "/ok")[0], &ENVOY_TIMEOUT_HEADER) <= 2_000);
    assert_eq!(headers_of(&envoy_seen, "/ok")[0][ENVOY_ATTEMPT_HEADER], "1");
}

/// A policy with a 1 s deadline that hands it to `named` only.
fn deadline_to(named: std::net::SocketAddr) -> RetryPolicy {
    RetryPolicy::builder()
        .deadline(Duration::from_secs(1))
        .send_deadline_to(&named.to_string())
        .build()
        .expect("policy")
}

fn carries_no_deadline(headers: &HeaderMap) -> bool {
    !headers.contains_key(TIMEOUT_HEADER) && !headers.contains_key(ATTEMPT_HEADER)
}

/// A redirect that reqwest follows below the middleware copies every header: with the
/// client built as documented (`redirect_policy`), the host the policy names answers `307`
/// to a host it does not, and that 307 comes back to the caller; the other host receives
/// nothing. Followed by hand through the same client, the other host gets no deadline.
/// Before: it received `request-timeout-ms: 999` and `request-attempt: 1`, 300 ms stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_never_carries_the_deadline_to_a_host_not_named() {
    let (named, named_seen) = server();
    let (other, other_seen) = server();
    let policy = deadline_to(named);
    let middleware = tower_retry_safety::RetrySafetyMiddleware::new(policy);
    let reqwest = reqwest::Client::builder()
        .redirect(middleware.redirect_policy())
        .build()
        .expect("client");
    let client = reqwest_middleware::ClientBuilder::new(reqwest)
        .with(middleware)
        .build();
    let to = format!("http://{other}/landed");
    let res = client
        .get(format!("http://{named}/redirect?to={to}"))
        .send()
        .await
        .expect("a response");
    assert_eq!(res.status(), StatusCode::TEMPORARY_REDIRECT);
    assert!(headers_of(&other_seen, "/landed").is_empty());
    assert!(headers_of(&named_seen, "/redirect")[0].contains_key(TIMEOUT_HEADER));
    // The caller follows it through the same client: the other host is not named.
    let location = res.headers()["location"]
        .to_str()
        .expect("ascii")
        .to_owned();
    client.get(location).send().await.expect("a response");
    let landed = headers_of(&other_seen, "/landed");
    assert_eq!(landed.len(), 1);
    assert!(carries_no_deadline(&landed[0]), "{:?}", landed[0]);
}

/// A reqwest client left with its default redirects carries the headers on: the crate
/// cannot stop it below the middleware, so it says so, loudly, naming the setup that does.
#[test]
fn a_redirect_followed_below_the_middleware_is_logged_as_an_error() {
    let (logs, leaked) = retry_safety_testing::logs::capture(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let (named, _) = server();
            let (other, other_seen) = server();
            let policy = deadline_to(named);
            let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
                .with(tower_retry_safety::RetrySafetyMiddleware::new(policy))
                .build();
            let to = format!("http://{other}/landed");
            let res = client
                .get(format!("http://{named}/redirect?to={to}"))
                .send()
                .await
                .expect("a response");
            assert_eq!(res.status(), StatusCode::OK, "followed by reqwest");
            headers_of(&other_seen, "/landed")[0].contains_key(TIMEOUT_HEADER)
        })
    });
    assert!(
        leaked,
        "the default client copies the header: what the log is about"
    );
    assert!(logs.contains("ERROR"), "{logs}");
    assert!(logs.contains("redirect_policy"), "{logs}");
}

/// tower-http's `FollowRedirect` above the layer sends each redirected request through the
/// layer again: the host not named gets no deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_redirect_above_the_layer_hands_no_deadline_to_a_host_not_named() {
    let (named, named_seen) = server();
    let (other, other_seen) = server();
    let policy = deadline_to(named);
    let svc = ServiceBuilder::new()
        .layer(tower_http::follow_redirect::FollowRedirectLayer::new())
        .layer(policy)
        .service(client());
    let to = format!("http://{other}/landed");
    let res = svc
        .oneshot(get(&format!("http://{named}/redirect?to={to}")))
        .await
        .expect("a response");
    assert_eq!(res.status(), StatusCode::OK);
    assert!(headers_of(&named_seen, "/redirect")[0].contains_key(TIMEOUT_HEADER));
    let landed = headers_of(&other_seen, "/landed");
    assert_eq!(landed.len(), 1);
    assert!(carries_no_deadline(&landed[0]), "{:?}", landed[0]);
}

/// A nested call whose policy runs in a `Buffer`'s worker (another task: no task-local)
/// carries its caller's deadline in the request's extensions. Before: sent with none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_through_a_buffer_carries_the_inbound_deadline_in_its_request() {
    let (addr, seen) = server();
    let policy = RetryPolicy::builder()
        .send_deadline_to(&addr.to_string())
        .build()
        .expect("policy");
    let buffered = tower::buffer::Buffer::new(policy.layer(client()), 8);
    let inbound = Inbound::within(Duration::from_millis(800));
    let mut req = get(&format!("http://{addr}/buffered"));
    req.extensions_mut().insert(inbound);
    let res = buffered.oneshot(req).await.expect("a response");
    assert_eq!(res.status(), StatusCode::OK);
    let sent = headers_of(&seen, "/buffered");
    assert!(millis(&sent[0], &TIMEOUT_HEADER) <= 800, "{:?}", sent[0]);
}

/// A task the handler spawns runs in the handler's deadline with one call,
/// `in_current_deadline`. Before: the spawned call carried none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawned_call_inherits_the_deadline_with_one_call() {
    let (addr, seen) = server();
    let policy = RetryPolicy::builder()
        .send_deadline_to(&addr.to_string())
        .build()
        .expect("policy");
    let svc = policy.layer(client());
    let url = format!("http://{addr}/spawned");
    let inbound = Inbound::within(Duration::from_millis(800));
    let res = deadline::scope(inbound, async move {
        let call = svc.oneshot(get(&url));
        tokio::spawn(call.in_current_deadline()).await
    })
    .await
    .expect("the task ran")
    .expect("a response");
    assert_eq!(res.status(), StatusCode::OK);
    let sent = headers_of(&seen, "/spawned");
    assert!(millis(&sent[0], &TIMEOUT_HEADER) <= 800, "{:?}", sent[0]);
}
