//! The HTTP/2 GOAWAY faults, seen on the wire and through clients: `goaway-before-forwarding`
//! sends a last-stream-id below the faulted stream (not processed: the upstream never sees
//! it), `goaway-after-apply` one that covers it and closes without its answer. Streams
//! already forwarded are answered before the connection closes; the ledger's counts equal
//! the upstream's; HTTP/1.1 clients get the connection-close faults.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retry_safety_lab::{demo_routes, Fault, Proxy, ProxyConfig, Report, TypicalPolicy, Upstream};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_retry_safety::RetryPolicy;

use crate::counting_upstream::CountingUpstream;
use crate::raw_h2_client::{RawH2, DATA, GOAWAY, HEADERS, RST_STREAM};
use crate::raw_upstream::{RawUpstream, Then, GUARD};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Far below the proxy's slow hold, far above a loopback round trip.
const PER_ATTEMPT: Duration = Duration::from_secs(2);

/// A proxy giving `faults` in turn, with the demo's routes and a 20 s slow hold.
pub(crate) async fn proxy(upstream: &str, faults: Vec<Fault>) -> Proxy {
    let config = ProxyConfig::new(upstream)
        .expect("valid upstream")
        .faults(faults)
        .routes(demo_routes())
        .slow(Duration::from_secs(20));
    Proxy::start(config, loopback()).await.expect("proxy")
}

fn loopback() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, 0))
}

fn h2_client() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

fn h1_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

fn policy() -> RetryPolicy {
    RetryPolicy::builder()
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .lock_free_budget(Duration::from_secs(10), 100, 1.0)
        .attempt_timeout(PER_ATTEMPT)
        .build()
        .expect("valid policy")
}

/// The GOAWAYs received: (last-stream-id, error code).
fn goaways(client: &RawH2) -> Vec<(u32, u32)> {
    client
        .of_kind(GOAWAY)
        .iter()
        .filter_map(|f| f.goaway())
        .collect()
}

/// The last-stream-id is 0, below stream 1: not processed. Nothing else is sent on the stream,
/// the connection closes, and the upstream never sees the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goaway_before_forwarding_tells_the_client_its_stream_was_not_processed() {
    let upstream = Upstream::start(loopback()).await.expect("upstream");
    let proxy = proxy(
        &format!("http://{}", upstream.addr()),
        vec![Fault::GoAwayBeforeForwarding],
    )
    .await;
    let mut client = RawH2::connect(proxy.addr()).await;
    client
        .post(1, "/v1/payments", &[], b"{\"amount\":100}")
        .await;
    client.read_to_close().await;
    assert_eq!(goaways(&client), vec![(0, 0)], "{:?}", client.frames);
    assert!(client.on_stream(1).is_empty(), "{:?}", client.on_stream(1));
    assert_eq!(upstream.handler_runs(), 0);
    let report = proxy.report();
    let row = &report.routes()[0];
    assert_eq!(row.route, "POST /v1/payments");
    assert_eq!(row.attempts, 1);
    assert_eq!(row.upstream_requests, 0);
    assert_eq!(row.failed_provably_unsent, 1);
}

/// The last-stream-id covers stream 1, which the upstream ran; its answer never comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goaway_after_apply_covers_the_stream_and_closes_without_its_answer() {
    let upstream = Upstream::start(loopback()).await.expect("upstream");
    let proxy = proxy(
        &format!("http://{}", upstream.addr()),
        vec![Fault::GoAwayAfterApply],
    )
    .await;
    let mut client = RawH2::connect(proxy.addr()).await;
    client
        .post(1, "/v1/payments", &[], b"{\"amount\":100}")
        .await;
    client.read_to_close().await;
    assert_eq!(goaways(&client), vec![(1, 0)], "{:?}", client.frames);
    assert!(client.on_stream(1).is_empty(), "{:?}", client.on_stream(1));
    assert_eq!(upstream.handler_runs(), 1);
    let report = proxy.report();
    let row = &report.routes()[0];
    assert_eq!(row.upstream_requests, 1);
    assert_eq!(row.failed_after_upstream, 1);
    assert_eq!(row.applied_twice, 0);
}

/// Sends stream `id` with a body of its own (one operation each).
async fn post_op(client: &mut RawH2, id: u32) {
    let body = format!("{{\"op\":{id}}}");
    client.post(id, "/v1/payments", &[], body.as_bytes()).await;
}

/// Three streams held at the upstream when the fourth's GOAWAY is sent: its last-stream-id is
/// the highest of them (5), below the faulted stream 7; the three are answered before the
/// connection closes, stream 7 gets nothing, and the upstream saw the three only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goaway_before_forwarding_answers_the_streams_already_forwarded() {
    let held = Then::HeldThenOk { replayed: false };
    let upstream = RawUpstream::start(vec![held]).await;
    let faults = vec![
        Fault::None,
        Fault::None,
        Fault::None,
        Fault::GoAwayBeforeForwarding,
    ];
    let proxy = proxy(&upstream.url(), faults).await;
    let mut client = RawH2::connect(proxy.addr()).await;
    for (n, id) in [1, 3, 5].into_iter().enumerate() {
        post_op(&mut client, id).await;
        upstream.wait_received(n as u32 + 1).await;
    }
    post_op(&mut client, 7).await;
    assert!(client.read_until(|f| f.kind == GOAWAY).await, "a GOAWAY");
    assert_eq!(goaways(&client), vec![(5, 0)]);
    // The GOAWAY came while the three were at the upstream.
    assert!(client.of_kind(HEADERS).is_empty(), "{:?}", client.frames);
    for n in 0..3 {
        upstream.release(n);
    }
    client.read_to_close().await;
    for id in [1, 3, 5] {
        assert_eq!(client.body(id).as_deref(), Some(&b"{}"[..]), "stream {id}");
    }
    assert!(client.on_stream(7).is_empty(), "{:?}", client.on_stream(7));
    assert_eq!(goaways(&client).len(), 1, "h2's own GOAWAYs are not sent");
    assert_eq!(upstream.received(), 3);
    let report = proxy.report();
    assert_eq!(report.upstream_requests(), u64::from(upstream.received()));
    let row = &report.routes()[0];
    assert_eq!(row.operations, 4);
    assert_eq!(row.answered_ok, 3);
    assert_eq!(row.failed_provably_unsent, 1);
    assert_eq!(row.pending, 0);
}

/// The faulted stream's body arrives after a higher stream was forwarded: the GOAWAY's
/// last-stream-id (3, the highest forwarded) covers the faulted stream 1, so the client
/// cannot tell it was not processed; the lab can: the upstream never saw it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goaway_before_forwarding_covers_the_stream_when_a_higher_one_was_forwarded() {
    let upstream = RawUpstream::start(vec![Then::HeldThenOk { replayed: false }]).await;
    let faults = vec![Fault::None, Fault::GoAwayBeforeForwarding];
    let proxy = proxy(&upstream.url(), faults).await;
    let mut client = RawH2::connect(proxy.addr()).await;
    client.open(1, "/v1/payments", &[]).await;
    post_op(&mut client, 3).await;
    upstream.wait_received(1).await;
    client.finish(1, b"{\"op\":1}").await;
    assert!(client.read_until(|f| f.kind == GOAWAY).await, "a GOAWAY");
    assert_eq!(goaways(&client), vec![(3, 0)]);
    upstream.release(0);
    client.read_to_close().await;
    assert_eq!(client.body(3).as_deref(), Some(&b"{}"[..]));
    assert!(client.on_stream(1).is_empty(), "{:?}", client.on_stream(1));
    assert_eq!(upstream.received(), 1);
    let report = proxy.report();
    let row = &report.routes()[0];
    assert_eq!(row.operations, 2);
    assert_eq!(row.upstream_requests, 1);
    assert_eq!(row.answered_ok, 1);
    assert_eq!(row.failed_provably_unsent, 1);
}

/// Nothing is forwarded after the GOAWAY, not even a stream it covers: stream 1's body
/// arrives after the GOAWAY(3), and stream 1 is reset with `REFUSED_STREAM` (not processed,
/// RFC 9113 §8.7), counted as an attempt never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_the_goaway_covers_but_not_yet_forwarded_is_refused() {
    let upstream = RawUpstream::start(vec![Then::HeldThenOk { replayed: false }]).await;
    let faults = vec![Fault::None, Fault::GoAwayBeforeForwarding, Fault::None];
    let proxy = proxy(&upstream.url(), faults).await;
    let mut client = RawH2::connect(proxy.addr()).await;
    client.open(1, "/v1/payments", &[]).await;
    post_op(&mut client, 3).await;
    upstream.wait_received(1).await;
    post_op(&mut client, 5).await;
    assert!(client.read_until(|f| f.kind == GOAWAY).await, "a GOAWAY");
    assert_eq!(goaways(&client), vec![(3, 0)]);
    client.finish(1, b"{\"op\":1}").await;
    assert!(client.read_until(|f| f.kind == RST_STREAM).await, "a reset");
    let reset = client.on_stream(1);
    assert_eq!(reset.len(), 1, "{reset:?}");
    assert_eq!(reset[0].kind, RST_STREAM);
    assert_eq!(reset[0].payload, 7u32.to_be_bytes(), "REFUSED_STREAM");
    upstream.release(0);
    client.read_to_close().await;
    assert_eq!(client.body(3).as_deref(), Some(&b"{}"[..]));
    assert!(client.on_stream(5).is_empty(), "{:?}", client.on_stream(5));
    assert_eq!(upstream.received(), 1);
    let report = proxy.report();
    let row = &report.routes()[0];
    assert_eq!(row.operations, 3);
    assert_eq!(row.upstream_requests, 1);
    assert_eq!(row.answered_ok, 1);
    assert_eq!(row.failed_provably_unsent, 2);
}

/// The fourth stream's answer came while three were held: the GOAWAY covers all four (7),
/// the three are answered once released, stream 7 never is; the upstream ran all four.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goaway_after_apply_lets_the_other_forwarded_streams_finish() {
    let held = Then::HeldThenOk { replayed: false };
    let upstream = RawUpstream::start(vec![held, held, held, Then::Reply("200 OK")]).await;
    let faults = vec![
        Fault::None,
        Fault::None,
        Fault::None,
        Fault::GoAwayAfterApply,
    ];
    let proxy = proxy(&upstream.url(), faults).await;
    let mut client = RawH2::connect(proxy.addr()).await;
    for (n, id) in [1, 3, 5, 7].into_iter().enumerate() {
        post_op(&mut client, id).await;
        upstream.wait_received(n as u32 + 1).await;
    }
    assert!(client.read_until(|f| f.kind == GOAWAY).await, "a GOAWAY");
    assert_eq!(goaways(&client), vec![(7, 0)]);
    assert!(client.of_kind(HEADERS).is_empty(), "{:?}", client.frames);
    for n in 0..3 {
        upstream.release(n);
    }
    client.read_to_close().await;
    for id in [1, 3, 5] {
        assert_eq!(client.body(id).as_deref(), Some(&b"{}"[..]), "stream {id}");
    }
    assert!(client.on_stream(7).is_empty(), "{:?}", client.on_stream(7));
    assert_eq!(goaways(&client).len(), 1);
    let report = proxy.report();
    assert_eq!(report.upstream_requests(), u64::from(upstream.received()));
    assert_eq!(upstream.received(), 4);
    let row = &report.routes()[0];
    assert_eq!(row.answered_ok, 3);
    assert_eq!(row.failed_after_upstream, 1);
    assert_eq!(row.pending, 0);
    assert!(client.of_kind(DATA).len() >= 3);
}

/// What a client got for `ops` writes and `ops` reads.
#[derive(Debug, PartialEq, Eq)]
struct Got {
    writes_ok: usize,
    reads_ok: usize,
    /// Writes whose error came from a remote GOAWAY that left their stream out (h2 fails the
    /// streams above its last-stream-id with it).
    writes_left_out: usize,
}

fn remote_goaway(err: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(err), |&e| e.source())
        .filter_map(|e| e.downcast_ref::<h2::Error>())
        .any(|e| e.is_remote() && e.is_go_away())
}

/// `ops` writes and reads, one operation at a time, through `svc`: each first attempt meets
/// its fault alone on its connection.
async fn one_at_a_time<S, B>(svc: S, base: &str, ops: usize) -> Got
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>> + Clone,
    S::Error: Into<tower_retry_safety::BoxError>,
    B: http_body::Body,
{
    let mut got = Got {
        writes_ok: 0,
        reads_ok: 0,
        writes_left_out: 0,
    };
    for i in 0..ops {
        let write = Request::post(format!("{base}/v1/payments"))
            .body(Full::new(Bytes::from(format!("{{\"ref\":\"op-{i}\"}}"))))
            .expect("valid request");
        let read = Request::get(format!("{base}/v1/payments/{i}"))
            .body(Full::new(Bytes::new()))
            .expect("valid request");
        for (req, write) in [(write, true), (read, false)] {
            let res = tokio::time::timeout(GUARD, svc.clone().oneshot(req))
                .await
                .expect("an outcome");
            match res {
                Ok(res) => {
                    if res.status().is_success() {
                        *(if write {
                            &mut got.writes_ok
                        } else {
                            &mut got.reads_ok
                        }) += 1;
                    }
                    let _ = res.into_body().collect().await;
                }
                Err(err) => {
                    let err: tower_retry_safety::BoxError = err.into();
                    if write && remote_goaway(&*err) {
                        got.writes_left_out += 1;
                    }
                }
            }
        }
    }
    got
}

/// Operations per kind in the client tests.
const OPS: usize = 6;

/// A fresh upstream and proxy with one fault; the upstream and the proxy's base URL.
async fn lab(fault: Fault) -> (Upstream, Proxy, String) {
    let upstream = Upstream::start(loopback()).await.expect("upstream");
    let proxy = proxy(&format!("http://{}", upstream.addr()), vec![fault]).await;
    let base = format!("http://{}", proxy.addr());
    (upstream, proxy, base)
}

fn write_row(report: &Report) -> retry_safety_lab::RouteCounts {
    report
        .routes()
        .iter()
        .find(|r| r.route == "POST /v1/payments")
        .expect("a write row")
        .clone()
}

/// A remote GOAWAY is ambiguous to this crate's classifier (hyper can hand one to a request it
/// already wrote), so its layer resends neither fault's writes, and reads recover. After
/// `goaway-before-forwarding` the upstream never saw the writes; after `goaway-after-apply`
/// it ran each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_crates_layer_over_h2_applies_no_write_twice_after_either_goaway() {
    let svc = || ServiceBuilder::new().layer(policy()).service(h2_client());

    let (upstream, proxy, base) = lab(Fault::GoAwayBeforeForwarding).await;
    let got = one_at_a_time(svc(), &base, OPS).await;
    // hyper's h2 client failed each write's stream as left out by the GOAWAY.
    let expected = Got {
        writes_ok: 0,
        reads_ok: OPS,
        writes_left_out: OPS,
    };
    assert_eq!(got, expected);
    let report = proxy.report();
    assert_eq!(report.applied_twice(), 0, "{}", report.table(0));
    assert_eq!(report.reads_recovered(), OPS as u64);
    let row = write_row(&report);
    assert_eq!(row.upstream_requests, 0);
    assert_eq!(row.failed_provably_unsent, OPS as u64);
    // The reads' resends only.
    assert_eq!(upstream.handler_runs(), OPS as u64);

    let (upstream, proxy, base) = lab(Fault::GoAwayAfterApply).await;
    let got = one_at_a_time(svc(), &base, OPS).await;
    // The GOAWAY covered each write's stream, which failed when the connection closed.
    let expected = Got {
        writes_ok: 0,
        reads_ok: OPS,
        writes_left_out: 0,
    };
    assert_eq!(got, expected);
    let report = proxy.report();
    assert_eq!(report.applied_twice(), 0, "{}", report.table(0));
    assert_eq!(report.reads_recovered(), OPS as u64);
    let row = write_row(&report);
    assert_eq!(row.upstream_requests, OPS as u64);
    assert_eq!(row.failed_after_upstream, OPS as u64);
    // Each write once, each read twice.
    assert_eq!(upstream.handler_runs(), 3 * OPS as u64);
}

/// The control: a retry-everything `tower::retry` over the same HTTP/2 client resends every
/// write, which applies each `goaway-after-apply` write twice, and each
/// `goaway-before-forwarding` write once (the first attempt never reached the upstream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typical_tower_retry_over_h2_applies_goaway_after_apply_writes_twice() {
    let svc = || {
        ServiceBuilder::new()
            .retry(TypicalPolicy::new(3))
            .timeout(PER_ATTEMPT)
            .service(h2_client())
    };

    let all_ok = Got {
        writes_ok: OPS,
        reads_ok: OPS,
        writes_left_out: 0,
    };
    let (upstream, proxy, base) = lab(Fault::GoAwayAfterApply).await;
    assert_eq!(one_at_a_time(svc(), &base, OPS).await, all_ok);
    let report = proxy.report();
    assert_eq!(report.applied_twice(), OPS as u64, "{}", report.table(0));
    assert_eq!(write_row(&report).upstream_requests, 2 * OPS as u64);
    assert_eq!(upstream.handler_runs(), 4 * OPS as u64);

    let (upstream, proxy, base) = lab(Fault::GoAwayBeforeForwarding).await;
    assert_eq!(one_at_a_time(svc(), &base, OPS).await, all_ok);
    let report = proxy.report();
    assert_eq!(report.applied_twice(), 0, "{}", report.table(0));
    assert_eq!(write_row(&report).upstream_requests, OPS as u64);
    assert_eq!(upstream.handler_runs(), 2 * OPS as u64);
}

/// HTTP/1.1 has no GOAWAY: the faults close the connection as `reset-before-forwarding` and
/// `drop-after-apply` do, and the proxy's counts are the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http1_client_gets_the_goaway_faults_as_connection_closes() {
    let svc = || {
        ServiceBuilder::new()
            .retry(TypicalPolicy::new(3))
            .timeout(PER_ATTEMPT)
            .service(h1_client())
    };
    for (goaway, twin, applied_twice) in [
        (
            Fault::GoAwayBeforeForwarding,
            Fault::ResetBeforeForwarding,
            0,
        ),
        (Fault::GoAwayAfterApply, Fault::DropAfterApply, OPS as u64),
    ] {
        let mut seen = Vec::new();
        for fault in [goaway, twin] {
            let (upstream, proxy, base) = lab(fault).await;
            let got = one_at_a_time(svc(), &base, OPS).await;
            assert_eq!((got.writes_ok, got.reads_ok), (OPS, OPS));
            let report = proxy.report();
            assert_eq!(report.applied_twice(), applied_twice, "{}", report.table(0));
            seen.push((report.to_json(0), upstream.handler_runs()));
        }
        assert_eq!(seen[0], seen[1], "{goaway:?} against {twin:?}");
    }
}

/// Many streams in flight on shared HTTP/2 connections while both GOAWAY faults close them:
/// streams forwarded before a GOAWAY, streams it refused, streams above its last-stream-id
/// that the client resends. Whatever the interleaving, the proxy's counts are the upstream's:
/// as many requests, and the writes applied twice are exactly those the upstream ran twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_equal_the_upstreams_when_goaways_hit_streams_in_flight() {
    const OPS: usize = 48;
    let upstream = CountingUpstream::start().await;
    let faults = vec![
        Fault::None,
        Fault::GoAwayBeforeForwarding,
        Fault::GoAwayAfterApply,
    ];
    let proxy = proxy(&format!("http://{}", upstream.addr()), faults).await;
    let base = format!("http://{}", proxy.addr());
    let svc = ServiceBuilder::new()
        .retry(TypicalPolicy::new(3))
        .timeout(PER_ATTEMPT)
        .service(h2_client());
    let in_flight = Arc::new(tokio::sync::Semaphore::new(16));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..OPS {
        for method in [Method::POST, Method::GET] {
            let (svc, in_flight) = (svc.clone(), in_flight.clone());
            let (uri, body) = if method == Method::POST {
                (
                    format!("{base}/v1/payments"),
                    format!("{{\"ref\":\"op-{i}\"}}"),
                )
            } else {
                (format!("{base}/v1/payments/{i}"), String::new())
            };
            tasks.spawn(async move {
                let _permit = in_flight.acquire_owned().await;
                let req = Request::builder()
                    .method(method)
                    .uri(uri)
                    .body(Full::new(Bytes::from(body)))
                    .expect("valid request");
                if let Ok(res) = svc.oneshot(req).await {
                    let _ = res.into_body().collect().await;
                }
            });
        }
    }
    tokio::time::timeout(GUARD, async { while tasks.join_next().await.is_some() {} })
        .await
        .expect("every operation ends");
    let report = proxy.drain(GUARD).await;
    let runs = upstream.runs();
    assert_eq!(report.pending(), 0, "{}", report.table(0));
    assert_eq!(report.writes(), OPS as u64);
    assert_eq!(report.reads(), OPS as u64);
    assert_eq!(
        report.upstream_requests(),
        runs.values().sum::<u64>(),
        "{}",
        report.table(0)
    );
    let writes_run_twice = runs
        .iter()
        .filter(|(op, n)| op.starts_with("POST") && **n >= 2)
        .count() as u64;
    assert_eq!(
        report.applied_twice(),
        writes_run_twice,
        "{}",
        report.table(0)
    );
    eprintln!("{}", report.table(0));
}

/// The lab's promise read off the wire, whatever the interleaving: on connections where
/// streams' bodies arrive late and in any order while both GOAWAY faults fire, no stream the
/// client was told was not processed (above the GOAWAY's last-stream-id, or reset
/// `REFUSED_STREAM`) reached the upstream, each connection gets at most one GOAWAY, and the
/// ledger's upstream requests are the upstream's. (An attack of the review of the GOAWAY
/// faults that held; kept as a guard.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_stream_told_not_processed_reached_the_upstream() {
    const ROUNDS: u32 = 30;
    const STREAMS: u32 = 10;
    let upstream = CountingUpstream::start().await;
    let faults = vec![
        Fault::None,
        Fault::None,
        Fault::GoAwayBeforeForwarding,
        Fault::None,
        Fault::None,
        Fault::GoAwayAfterApply,
        Fault::None,
    ];
    let proxy = proxy(&format!("http://{}", upstream.addr()), faults).await;
    // A fixed pseudo-random sequence (an LCG): the same interleavings on every run.
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut draw = move |n: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % n
    };
    let mut told_wrong = Vec::new();
    let mut gone_away = 0;
    for round in 0..ROUNDS {
        let mut client = RawH2::connect(proxy.addr()).await;
        let ids: Vec<u32> = (0..STREAMS).map(|i| 2 * i + 1).collect();
        let body = |id: u32| format!("{{\"round\":{round},\"stream\":{id}}}");
        let mut late = Vec::new();
        for &id in &ids {
            client.open(id, "/v1/payments", &[]).await;
            if draw(3) == 0 {
                late.push(id);
            } else {
                client.finish(id, body(id).as_bytes()).await;
            }
            if draw(4) == 0 {
                tokio::time::sleep(Duration::from_micros(draw(2000))).await;
            }
        }
        while !late.is_empty() {
            let id = late.swap_remove(draw(late.len() as u64) as usize);
            if draw(2) == 0 {
                tokio::time::sleep(Duration::from_micros(draw(3000))).await;
            }
            client.finish(id, body(id).as_bytes()).await;
        }
        client.read_to_close().await;
        let goaways = goaways(&client);
        assert!(goaways.len() <= 1, "round {round}: {goaways:?}");
        let last = goaways.first().map(|&(last, _)| last);
        gone_away += goaways.len();
        let runs = upstream.runs();
        for &id in &ids {
            let ran = runs
                .get(&format!("POST /v1/payments {}", body(id)))
                .copied()
                .unwrap_or(0);
            let refused = client
                .on_stream(id)
                .iter()
                .any(|f| f.kind == RST_STREAM && f.payload == 7u32.to_be_bytes());
            let left_out = last.is_some_and(|last| id > last);
            if ran > 0 && (refused || left_out) {
                told_wrong.push((round, id, last, refused));
            }
        }
    }
    assert!(told_wrong.is_empty(), "{told_wrong:?}");
    // Two GOAWAY faults in every seven, at most three apart: of a round's ten operations,
    // counted in turn until its GOAWAY, one meets a GOAWAY fault.
    assert_eq!(gone_away, ROUNDS as usize);
    let report = proxy.drain(GUARD).await;
    assert_eq!(
        report.upstream_requests(),
        upstream.runs().values().sum::<u64>(),
        "{}",
        report.table(0)
    );
}
