//! Adversarial review of the gRPC support (issue 24): real tonic servers on 127.0.0.1 that
//! count side effects, with a reviewer's layer (`Rev`) that answers as a misbehaving or
//! unusual server would (odd `grpc-status` spellings, a status after messages, a stream
//! answered before its end, custom trailers, a handler's own UNAVAILABLE behind the
//! server's `IdempotencyLayer`). No gRPC write without a trusted key was sent twice. The three
//! defects it found are fixed and their tests run: a hand-written catch-all write rule lost to
//! the proto's exact paths; a handler's UNAVAILABLE was stored even with
//! `store_server_errors(false)`; an answer too large to keep replayed as a status-less
//! response.
#![cfg(feature = "tonic")]

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::grpc_lab::lab::ledger_client::LedgerClient;
use crate::grpc_lab::lab::{CountRequest, Entry};
use crate::grpc_lab::{channel, request, serve, serve_keyed, serve_with, Fault};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use prost::Message;
use tonic::body::Body;
use tonic::Code;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_idempotency_keys::{IdempotencyLayer, MemoryStore};
use tower_retry_safety::grpc::{ATTEMPTS_KEY, MAY_HAVE_BEEN_APPLIED_KEY};
use tower_retry_safety::{Idempotency, NoRetry, RetryPolicy, RetryPolicyBuilder};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Every call ends within this long, or the test fails (a hang is a defect).
const LIMIT: Duration = Duration::from_secs(20);

async fn within<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(LIMIT, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: hung for {LIMIT:?}"))
}

fn builder() -> RetryPolicyBuilder {
    RetryPolicy::builder()
        .jitter(false)
        .backoff(Duration::from_millis(5), Duration::from_millis(20))
        .max_retries(2)
        .attempt_timeout(Duration::from_secs(2))
        .grpc_descriptors(&crate::grpc_lab::descriptor_set())
}

type Client = LedgerClient<
    tower::util::MapErr<
        tower_retry_safety::RetrySafety<tonic::transport::Channel>,
        fn(tower_retry_safety::Error) -> tonic::Status,
    >,
>;

async fn client(addr: std::net::SocketAddr, policy: RetryPolicy) -> Client {
    let svc = ServiceBuilder::new()
        .map_err(tonic::Status::from as fn(_) -> _)
        .layer(policy)
        .service(channel(addr).await);
    LedgerClient::new(svc)
}

fn entry(id: &str) -> Entry {
    Entry {
        id: id.into(),
        payload: vec![7; 16],
    }
}

/// A lab request that also asks the reviewer's layer for `rev` (see [`Rev`]).
fn rev_request<T>(message: T, id: &str, rev: &str) -> tonic::Request<T> {
    let mut req = request(message, id, None);
    req.metadata_mut().insert("x-rev", rev.parse().unwrap());
    req
}

// ---------------------------------------------------------------------------------------
// The reviewer's layer. `x-rev` (fields split by `|`):
// - `after|<status bytes>[|<pushback>]`: the handler runs (applies), then the answer is a
//   trailers-only response with `grpc-status` exactly these bytes;
// - `before|<status bytes>[|<pushback>]`: the same without running the handler;
// - `then|<status>|<message>`: the handler's answer (headers, message), with its trailers
//   rewritten to this status and message, plus `x-custom-trailer: kept`;
// - `partial`: reads the client stream's first message, counts it applied (`Rev::applied`),
//   then answers a trailers-only UNAVAILABLE while the client is still sending;
// - `unavailable-first`: the first call with this `x-call-id` is answered UNAVAILABLE by
//   the handler's side without running it (nothing applied); later ones run.
// ---------------------------------------------------------------------------------------

#[derive(Clone, Default)]
struct Rev {
    applied: Arc<Mutex<HashMap<String, u32>>>,
    calls: Arc<Mutex<HashMap<String, u32>>>,
    seen: Arc<Mutex<HashSet<String>>>,
}

impl Rev {
    fn applied(&self, id: &str) -> u32 {
        self.applied.lock().unwrap().get(id).copied().unwrap_or(0)
    }

    /// Attempts of call `id` that reached this layer (it answers some without the lab).
    fn calls(&self, id: &str) -> u32 {
        self.calls.lock().unwrap().get(id).copied().unwrap_or(0)
    }
}

#[derive(Clone)]
struct RevSvc<S> {
    inner: S,
    rev: Rev,
}

impl<S> Layer<S> for Rev {
    type Service = RevSvc<S>;
    fn layer(&self, inner: S) -> RevSvc<S> {
        RevSvc {
            inner,
            rev: self.clone(),
        }
    }
}

fn trailers_only(status: &str, pushback: Option<&str>) -> Response<Body> {
    let mut res = Response::new(Body::empty());
    let headers = res.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", HeaderValue::from_str(status).unwrap());
    headers.insert("grpc-message", HeaderValue::from_static("rev"));
    if let Some(ms) = pushback {
        headers.insert("grpc-retry-pushback-ms", HeaderValue::from_str(ms).unwrap());
    }
    res
}

/// A body whose trailers are rewritten.
struct EditTrailers {
    inner: Body,
    status: String,
    message: String,
}

impl http_body::Body for EditTrailers {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(match frame.into_trailers() {
                Ok(mut trailers) => {
                    trailers.insert("grpc-status", HeaderValue::from_str(&this.status).unwrap());
                    trailers.insert(
                        "grpc-message",
                        HeaderValue::from_str(&this.message).unwrap(),
                    );
                    trailers.insert("x-custom-trailer", HeaderValue::from_static("kept"));
                    Frame::trailers(trailers)
                }
                Err(frame) => frame,
            }))),
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}

impl<S, B, RB> Service<Request<B>> for RevSvc<S>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Response<Body>, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
                .unwrap_or_default()
        };
        let (mode, id) = (header("x-rev"), header("x-call-id"));
        let first = self.rev.seen.lock().unwrap().insert(id.clone());
        *self
            .rev
            .calls
            .lock()
            .unwrap()
            .entry(id.clone())
            .or_default() += 1;
        let rev = self.rev.clone();
        let mut inner = self.inner.clone();
        std::mem::swap(&mut inner, &mut self.inner);
        Box::pin(async move {
            let fields: Vec<&str> = mode.split('|').collect();
            match fields[..] {
                ["after", status, ..] => {
                    let res = inner.call(req).await.map_err(Into::into)?;
                    drop(res);
                    Ok(trailers_only(status, fields.get(2).copied()))
                }
                ["before", status, ..] => Ok(trailers_only(status, fields.get(2).copied())),
                ["then", status, message] => {
                    let res = inner.call(req).await.map_err(Into::into)?;
                    Ok(res.map(|b| {
                        Body::new(EditTrailers {
                            inner: Body::new(b),
                            status: status.to_owned(),
                            message: message.to_owned(),
                        })
                    }))
                }
                ["partial"] => {
                    let mut body = Box::pin(req.into_body());
                    let first_frame = body.as_mut().frame().await;
                    assert!(first_frame.is_some(), "the stream's first message");
                    *rev.applied.lock().unwrap().entry(id).or_default() += 1;
                    Ok(trailers_only("14", None))
                }
                ["unavailable-first"] if first => Ok(trailers_only("14", None)),
                _ => Ok(inner.call(req).await.map_err(Into::into)?.map(Body::new)),
            }
        })
    }
}

async fn serve_rev() -> (std::net::SocketAddr, crate::grpc_lab::Lab, Rev) {
    let rev = Rev::default();
    let (addr, lab) = serve_with(rev.clone()).await;
    (addr, lab, rev)
}

// ---------------------------------------------------------------------------------------
// Never twice.
// ---------------------------------------------------------------------------------------

/// A write (Append: no idempotency_level, no key) that the handler applied, then answered
/// with each retryable code, odd spellings of them, and pushback: applied once, one attempt.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[tokio::test]
async fn a_write_applied_then_answered_any_retryable_status_is_sent_once() {
    let (addr, lab, rev_layer) = serve_rev().await;
    let mut client = client(addr, builder().build().unwrap()).await;
    let answers = [
        "after|14",
        "after|8",
        "after|10",
        "after|4",
        "after|14|0",
        "after|8|0",
        "after|10|0",
        "after|4|1",
        "after|014",
        "after|0014",
        "after|14 ",
        "after| 14",
        "after|99999999999",
        "after|4294967310",
        "after|+14",
        "after|1e1",
        "after|",
    ];
    for (i, rev) in answers.into_iter().enumerate() {
        let id = format!("w-{i}");
        let res = within(rev, client.append(rev_request(entry(&id), &id, rev))).await;
        assert!(res.is_err(), "{rev}: {res:?}");
        assert_eq!(lab.applied(&id), 1, "{rev}");
        assert_eq!(lab.attempts(&id).len(), 1, "{rev}: sent again");
        assert_eq!(rev_layer.calls(&id), 1, "{rev}: sent again");
    }
    // A key the policy does not trust changes nothing, even with ABORTED and pushback.
    let mut keyed = rev_request(entry("w-key"), "w-key", "after|10|0");
    keyed
        .metadata_mut()
        .insert("idempotency-key", "k-untrusted".parse().unwrap());
    let res = within("untrusted key", client.append(keyed)).await;
    assert!(res.is_err());
    assert_eq!(lab.attempts("w-key").len(), 1);
    assert_eq!(lab.applied_twice(), 0);
}

/// Messages, then a failing status in the trailers: the call is committed (A6), a read
/// included; nothing is sent again.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[tokio::test]
async fn messages_then_a_failing_status_commit_the_call() {
    let (addr, lab, _rev) = serve_rev().await;
    let mut client = client(addr, builder().build().unwrap()).await;
    for code in ["14", "8", "4", "10"] {
        let id = format!("read-{code}");
        let rev = format!("then|{code}|late");
        let status = within(
            &rev,
            client.count(rev_request(CountRequest { id: id.clone() }, &id, &rev)),
        )
        .await
        .unwrap_err();
        assert_eq!(
            i32::from(status.code()),
            code.parse::<i32>().unwrap(),
            "{status:?}"
        );
        assert_eq!(
            lab.attempts(&id).len(),
            1,
            "{rev}: a committed read was sent again"
        );
        let id = format!("write-{code}");
        let status = within(&rev, client.append(rev_request(entry(&id), &id, &rev)))
            .await
            .unwrap_err();
        assert_eq!(i32::from(status.code()), code.parse::<i32>().unwrap());
        assert_eq!(lab.attempts(&id).len(), 1);
        assert_eq!(lab.applied(&id), 1);
    }
}

fn slow_stream(id: &'static str, n: usize) -> impl futures_util::Stream<Item = Entry> + Send {
    futures_util::stream::unfold(0, move |i| async move {
        if i == n {
            return None;
        }
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        Some((entry(id), i + 1))
    })
}

/// The `responded` change: a client-streaming write whose server applied the first message
/// and answered UNAVAILABLE while the client was still streaming is not replayed; the same
/// stream to a read (Sum) is replayed whole.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[tokio::test]
async fn a_stream_write_applied_in_part_then_unavailable_is_not_replayed() {
    let (addr, lab, rev) = serve_rev().await;
    let mut client = client(addr, builder().build().unwrap()).await;
    let status = within(
        "upload",
        client.upload(rev_request(slow_stream("up-part", 5), "up-part", "partial")),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(rev.applied("up-part"), 1);
    assert_eq!(
        rev.calls("up-part"),
        1,
        "the partly applied write was replayed"
    );
    assert_eq!(
        status.metadata().get(MAY_HAVE_BEEN_APPLIED_KEY).unwrap(),
        "true"
    );

    // The read: the first attempt partly read, then a replay of the whole stream.
    let mut read = rev_request(slow_stream("sum-part", 5), "sum-part", "partial");
    // `partial` answers every attempt: only the first one for the read.
    read.metadata_mut().remove("x-rev");
    read.metadata_mut().insert(
        "x-fault",
        Fault::UnavailableBefore.header().parse().unwrap(),
    );
    let res = within("sum", client.sum(read)).await.unwrap();
    assert_eq!(res.get_ref().applied, 1);
    assert_eq!(lab.attempts("sum-part").len(), 2);
    assert_eq!(
        lab.streamed("sum-part"),
        [5],
        "the replay is the whole stream"
    );
}

/// A stream reset after apply (RST_STREAM), for a unary and a streaming write: once.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[tokio::test]
async fn a_write_reset_after_apply_is_sent_once() {
    let (addr, lab) = serve().await;
    let mut client = client(addr, builder().build().unwrap()).await;
    let status = within(
        "append",
        client.append(request(entry("rst"), "rst", Some(Fault::ResetAfterApply))),
    )
    .await
    .unwrap_err();
    assert_eq!(
        status.metadata().get(MAY_HAVE_BEEN_APPLIED_KEY).unwrap(),
        "true"
    );
    assert_eq!(lab.attempts("rst").len(), 1);
    assert_eq!(lab.applied("rst"), 1);
    let status = within(
        "upload",
        client.upload(request(
            futures_util::stream::iter(vec![entry("rst-s"), entry("rst-s")]),
            "rst-s",
            Some(Fault::ResetAfterApply),
        )),
    )
    .await
    .unwrap_err();
    assert_ne!(status.code(), Code::Ok);
    assert_eq!(lab.attempts("rst-s").len(), 1);
    assert_eq!(lab.applied("rst-s"), 1);
}

// ---------------------------------------------------------------------------------------
// Descriptors.
// ---------------------------------------------------------------------------------------

fn verdict(policy: &RetryPolicy, path: &str) -> Idempotency {
    let req = http::Request::post(format!("http://svc{path}"))
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    policy.classify(&req).idempotency()
}

fn method(name: &str, level: Option<i32>) -> prost_types::MethodDescriptorProto {
    prost_types::MethodDescriptorProto {
        name: Some(name.into()),
        options: level.map(|l| prost_types::MethodOptions {
            idempotency_level: Some(l),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn set(
    files: Vec<(&str, &str, Vec<prost_types::MethodDescriptorProto>)>,
) -> prost_types::FileDescriptorSet {
    prost_types::FileDescriptorSet {
        file: files
            .into_iter()
            .map(
                |(package, service, methods)| prost_types::FileDescriptorProto {
                    package: Some(package.into()),
                    service: vec![prost_types::ServiceDescriptorProto {
                        name: Some(service.into()),
                        method: methods,
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            )
            .collect(),
    }
}

const IDEMPOTENT: i32 = 2;
const NO_SIDE_EFFECTS: i32 = 1;

/// A rule by hand that says write, for the exact path the proto marks IDEMPOTENT: the write
/// wins (fails closed). The same method name in two packages: only the marked one is a read.
/// An unknown idempotency_level value is a write.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[test]
fn a_hand_written_write_rule_outranks_the_proto_and_packages_stay_apart() {
    let policy = builder()
        .route(
            Method::POST,
            "/lab.v1.Ledger/Put",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    assert_eq!(
        verdict(&policy, "/lab.v1.Ledger/Put"),
        Idempotency::NonIdempotent
    );
    assert_eq!(
        verdict(&policy, "/lab.v1.Ledger/Count"),
        Idempotency::Idempotent
    );
    assert_eq!(
        verdict(&policy, "/lab.v1.Ledger/Append"),
        Idempotency::NonIdempotent
    );

    let two = set(vec![
        (
            "a.v1",
            "Ledger",
            vec![method("Count", Some(NO_SIDE_EFFECTS))],
        ),
        (
            "b.v1",
            "Ledger",
            vec![method("Count", None), method("Odd", Some(99))],
        ),
    ]);
    let policy = RetryPolicy::builder()
        .grpc_descriptors(&two)
        .build()
        .unwrap();
    assert_eq!(
        verdict(&policy, "/a.v1.Ledger/Count"),
        Idempotency::Idempotent
    );
    assert_eq!(
        verdict(&policy, "/b.v1.Ledger/Count"),
        Idempotency::NonIdempotent
    );
    assert_eq!(
        verdict(&policy, "/b.v1.Ledger/Odd"),
        Idempotency::NonIdempotent
    );
}

/// A catch-all rule by hand that says the whole service writes
/// (`POST /lab.v1.Ledger/{*rest}` NonIdempotent), and the proto marking `Count`
/// NO_SIDE_EFFECTS (and `Put` IDEMPOTENT).
///
/// Found by the review, fixed (weaker, did not fail closed): the proto won. `ProtoRoutes::add_to` skips a
/// proto path only when a hand rule has the very same template; otherwise it adds a static
/// `Idempotent` rule, and a static rule outranks a catch-all within one spelling. So the
/// user's explicit "this whole service writes" is silently overridden for every method the
/// proto marks, contrary to "a rule given by hand outranks the proto" (builder docs): today
/// `Count` classifies `Idempotent` (expected `NonIdempotent`), and a trailers-only
/// UNAVAILABLE after apply would be retried. Fix: in `add_to`, build a table of the hand rules
/// and skip a proto path that any hand `NonIdempotent` rule matches (or consult proto rules
/// only when no hand rule matches), or refuse the combination in `build()`.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[test]
fn a_hand_written_catch_all_write_rule_against_the_proto() {
    let policy = builder()
        .route(
            Method::POST,
            "/lab.v1.Ledger/{*rest}",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    assert_eq!(
        verdict(&policy, "/lab.v1.Ledger/Append"),
        Idempotency::NonIdempotent
    );
    assert_eq!(
        verdict(&policy, "/lab.v1.Ledger/Count"),
        Idempotency::NonIdempotent,
        "a hand-written write rule covering the method lost to the proto"
    );
}

/// gRPC method paths are case-sensitive: `Get` marked IDEMPOTENT must not make its sibling
/// `get` (no option: a write) a read, nor a package `Lab.v1` make `lab.v1` one.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[test]
fn a_read_in_the_proto_does_not_make_a_method_differing_in_case_a_read() {
    let protos = set(vec![
        (
            "shop.v1",
            "Orders",
            vec![method("Get", Some(IDEMPOTENT)), method("get", None)],
        ),
        (
            "Lab.v1",
            "Ledger",
            vec![method("Send", Some(NO_SIDE_EFFECTS))],
        ),
        ("lab.v1", "Ledger", vec![method("Send", None)]),
    ]);
    let policy = RetryPolicy::builder().grpc_descriptors(&protos).build();
    let policy = policy.expect("a proto with methods differing in case builds");
    assert_eq!(
        verdict(&policy, "/shop.v1.Orders/Get"),
        Idempotency::Idempotent
    );
    assert_eq!(
        verdict(&policy, "/shop.v1.Orders/get"),
        Idempotency::NonIdempotent,
        "a write taken for a read through letter case"
    );
    assert_eq!(
        verdict(&policy, "/lab.v1.Ledger/Send"),
        Idempotency::NonIdempotent,
        "a write in another package taken for a read through letter case"
    );
}

/// Malformed descriptor bytes fail `build()`, never panic: truncations of a real set, a huge
/// length, nesting past prost's recursion limit.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[test]
fn malformed_descriptor_bytes_fail_build_without_panicking() {
    let good = crate::grpc_lab::descriptor_set().encode_to_vec();
    assert!(RetryPolicy::builder()
        .grpc_descriptor_bytes(&good)
        .build()
        .is_ok());
    for cut in 0..good.len() {
        let bytes = &good[..cut];
        let decodes = prost_types::FileDescriptorSet::decode(bytes).is_ok();
        let built = RetryPolicy::builder().grpc_descriptor_bytes(bytes).build();
        assert_eq!(built.is_ok(), decodes, "cut at {cut}");
    }
    let huge = [0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f];
    assert!(RetryPolicy::builder()
        .grpc_descriptor_bytes(&huge)
        .build()
        .is_err());
    // FileDescriptorSet.file { message_type { nested_type { nested_type { ... } } } }
    let mut nested: Vec<u8> = Vec::new();
    for _ in 0..300 {
        let mut outer = vec![0x1a];
        prost::encoding::encode_varint(nested.len() as u64, &mut outer);
        outer.extend_from_slice(&nested);
        nested = outer;
    }
    let mut file = vec![0x22];
    prost::encoding::encode_varint(nested.len() as u64, &mut file);
    file.extend_from_slice(&nested);
    let mut deep = vec![0x0a];
    prost::encoding::encode_varint(file.len() as u64, &mut deep);
    deep.extend_from_slice(&file);
    let err = RetryPolicy::builder()
        .grpc_descriptor_bytes(&deep)
        .build()
        .unwrap_err();
    assert_eq!(err.setting_name(), "grpc_descriptor_bytes");
}

// ---------------------------------------------------------------------------------------
// Reads recovered.
// ---------------------------------------------------------------------------------------

fn parse_timeout(value: &HeaderValue) -> Duration {
    let text = value.to_str().unwrap();
    let (digits, unit) = text.split_at(text.len() - 1);
    let n: u64 = digits.parse().unwrap();
    match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => panic!("unit {unit}"),
    }
}

/// UNAVAILABLE before apply on a NO_SIDE_EFFECTS and an IDEMPOTENT method: retried, with the
/// caller's `grpc-timeout` rewritten to no more than what is left and the previous attempts
/// counted. A pushback over `max_retry_after` ends the retries; a negative one too.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[tokio::test]
async fn reads_are_recovered_with_the_time_left_and_the_attempts_before() {
    let (addr, lab, rev) = serve_rev().await;
    let mut client = client(
        addr,
        builder()
            .max_retry_after(Duration::from_secs(1))
            .build()
            .unwrap(),
    )
    .await;
    let mut read = request(
        CountRequest { id: "r1".into() },
        "r1",
        Some(Fault::UnavailableBefore),
    );
    read.set_timeout(Duration::from_secs(5));
    within("count", client.count(read)).await.unwrap();
    let attempts = lab.attempts("r1");
    assert_eq!(attempts.len(), 2);
    let first = parse_timeout(&attempts[0]["grpc-timeout"]);
    let second = parse_timeout(&attempts[1]["grpc-timeout"]);
    assert!(first <= Duration::from_secs(5), "{first:?}");
    assert!(second < first, "{first:?} then {second:?}");
    assert_eq!(attempts[1]["grpc-previous-rpc-attempts"], "1");
    assert!(attempts[0].get("grpc-previous-rpc-attempts").is_none());

    let res = within(
        "put",
        client.put(request(entry("p1"), "p1", Some(Fault::UnavailableBefore))),
    )
    .await
    .unwrap();
    assert_eq!(res.get_ref().applied, 1);
    assert_eq!(lab.attempts("p1").len(), 2);

    let rev_layer = rev;
    for (id, rev, calls) in [
        ("r-plain", "before|14", 3),
        ("r-long", "before|14|60000", 1),
        ("r-neg", "before|14|-5", 1),
    ] {
        let status = within(
            rev,
            client.count(rev_request(CountRequest { id: id.into() }, id, rev)),
        )
        .await
        .unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(rev_layer.calls(id), calls, "{rev}");
    }
}

// ---------------------------------------------------------------------------------------
// Server.
// ---------------------------------------------------------------------------------------

fn keyed<T>(message: T, id: &str, key: &str) -> tonic::Request<T> {
    let mut req = request(message, id, None);
    req.metadata_mut()
        .insert("idempotency-key", key.parse().unwrap());
    req
}

fn keyed_builder() -> RetryPolicyBuilder {
    builder().honor_idempotency_key(true)
}

/// A keyed write whose answer (a failing status in trailers after a message, with a custom
/// trailer) is lost after the server stored it: the retry gets the stored answer, its
/// grpc-status, grpc-message and custom trailer; and an OK one with its custom trailer.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[tokio::test]
async fn a_keyed_write_replays_its_trailers() {
    let rev = Rev::default();
    let layer = {
        let rev = rev.clone();
        tower::layer::layer_fn(move |routes| {
            IdempotencyLayer::new(MemoryStore::new()).layer(rev.layer(routes))
        })
    };
    let (addr, lab) = serve_keyed(layer).await;
    let mut client = client(addr, keyed_builder().build().unwrap()).await;

    let mut req = keyed(entry("t-fail"), "t-fail", "k-fail");
    req.metadata_mut()
        .insert("x-rev", "then|9|stored message".parse().unwrap());
    req.metadata_mut().insert(
        "x-fault",
        Fault::UnavailableAfterApply.header().parse().unwrap(),
    );
    let status = within("t-fail", client.append(req)).await.unwrap_err();
    assert_eq!(lab.applied("t-fail"), 1);
    assert_eq!(lab.attempts("t-fail").len(), 2);
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(status.message(), "stored message");
    assert_eq!(status.metadata().get("x-custom-trailer").unwrap(), "kept");

    let mut req = keyed(entry("t-ok"), "t-ok", "k-ok");
    req.metadata_mut()
        .insert("x-rev", "then|0|".parse().unwrap());
    req.metadata_mut()
        .insert("x-fault", Fault::ResetAfterApply.header().parse().unwrap());
    let res = within("t-ok", client.append(req)).await.unwrap();
    assert_eq!(res.get_ref().applied, 1);
    assert_eq!(res.metadata().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(res.metadata().get("x-custom-trailer").unwrap(), "kept");
    assert_eq!(lab.applied("t-ok"), 1);
    assert_eq!(lab.applied_twice(), 0);
}

/// Eight concurrent calls with one key: the handler runs once; every other call gets
/// ABORTED (in flight) or the replay, never a second run.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[tokio::test]
async fn concurrent_repeats_of_a_key_run_once() {
    let (addr, lab) = serve_keyed(IdempotencyLayer::new(MemoryStore::new())).await;
    let once = keyed_builder().max_retries(0).build().unwrap();
    let mut calls = Vec::new();
    for _ in 0..8 {
        let mut client = client(addr, once.clone()).await;
        calls.push(tokio::spawn(async move {
            let mut req = keyed(entry("burst"), "burst", "k-burst");
            req.metadata_mut()
                .insert("x-delay-ms", "200".parse().unwrap());
            req.extensions_mut().insert(NoRetry);
            client.append(req).await
        }));
    }
    let mut ok = 0;
    for call in calls {
        match within("burst", call).await.unwrap() {
            Ok(res) => {
                assert_eq!(res.get_ref().applied, 1);
                ok += 1;
            }
            Err(status) => assert_eq!(status.code(), Code::Aborted, "{status:?}"),
        }
    }
    assert!(ok >= 1);
    assert_eq!(lab.applied("burst"), 1);
}

/// A handler's own UNAVAILABLE before it applied anything (its database was down), behind
/// the server layer told so (`store_server_errors(false)`: the handler promises a server error
/// applied nothing, as for an HTTP 5xx). For gRPC the same failure is an HTTP 200 with
/// `grpc-status: 14`.
///
/// What happened (the review's finding): the layer stored it like a success even so, so the
/// client's keyed retry got the stored UNAVAILABLE replayed (marked `idempotent-replayed`,
/// final) and the key was burnt: 0 applied, 2 attempts, the call failed. Fixed: a
/// trailers-only status that gRPC maps to a 5xx (UNAVAILABLE among them) is a server error for
/// `store_server_errors` (`server::outcome::is_server_error`), in lease and atomic mode.
///
/// (The review read `store_server_errors` as off by default; it is on: by default a server
/// error is stored and replayed, the key kept, the write not run again; see the next test.)
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[tokio::test]
async fn a_handlers_unavailable_before_apply_does_not_burn_the_key() {
    let rev = Rev::default();
    let layer = {
        let rev = rev.clone();
        tower::layer::layer_fn(move |routes| {
            IdempotencyLayer::new(MemoryStore::new())
                .store_server_errors(false)
                .layer(rev.layer(routes))
        })
    };
    let (addr, lab) = serve_keyed(layer).await;
    let mut client = client(addr, keyed_builder().build().unwrap()).await;
    let mut req = keyed(entry("down"), "down", "k-down");
    req.metadata_mut()
        .insert("x-rev", "unavailable-first".parse().unwrap());
    let res = within("down", client.append(req)).await;
    assert_eq!(lab.attempts("down").len(), 2);
    assert!(
        res.is_ok(),
        "the key was burnt by a stored UNAVAILABLE: {res:?}"
    );
    assert_eq!(lab.applied("down"), 1);
}

/// The default keeps a handler's UNAVAILABLE, as it keeps an HTTP 5xx: the server cannot know
/// that nothing was applied, so the repeat gets the stored answer and the handler does not run
/// again (2 attempts, 0 applied, the call fails with the replayed UNAVAILABLE).
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[tokio::test]
async fn by_default_a_handlers_unavailable_is_kept_and_replayed() {
    let rev = Rev::default();
    let layer = {
        let rev = rev.clone();
        tower::layer::layer_fn(move |routes| {
            IdempotencyLayer::new(MemoryStore::new()).layer(rev.layer(routes))
        })
    };
    let (addr, lab) = serve_keyed(layer).await;
    let mut client = client(addr, keyed_builder().build().unwrap()).await;
    let mut req = keyed(entry("kept"), "kept", "k-kept");
    req.metadata_mut()
        .insert("x-rev", "unavailable-first".parse().unwrap());
    let res = within("kept", client.append(req)).await;
    assert_eq!(lab.attempts("kept").len(), 2);
    let status = res.expect_err("the stored UNAVAILABLE is replayed");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(lab.applied("kept"), 0);
}

/// Malformed key metadata (non-ASCII bytes, too long, empty) is answered INVALID_ARGUMENT;
/// nothing runs, no panic.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[tokio::test]
async fn malformed_key_metadata_is_refused_as_invalid_argument() {
    let (addr, lab) = serve_keyed(IdempotencyLayer::new(MemoryStore::new())).await;
    let mut client = client(addr, keyed_builder().build().unwrap()).await;
    let long = "k".repeat(300);
    let values: Vec<HeaderValue> = vec![
        HeaderValue::from_bytes(b"\xffbad\x80").unwrap(),
        HeaderValue::from_str(&long).unwrap(),
        HeaderValue::from_static(""),
    ];
    for (i, value) in values.into_iter().enumerate() {
        let id = format!("bad-{i}");
        let mut req = request(entry(&id), &id, None);
        let mut http_req = http::Request::new(());
        http_req.headers_mut().insert("idempotency-key", value);
        let md = tonic::metadata::MetadataMap::from_headers(http_req.headers().clone());
        for kv in md.iter() {
            if let tonic::metadata::KeyAndValueRef::Ascii(k, v) = kv {
                req.metadata_mut().insert(k.clone(), v.clone());
            }
        }
        let status = within(&id, client.append(req)).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{i}: {status:?}");
        assert_eq!(lab.applied(&id), 0);
    }
}

/// A record with trailers in Redis round-trips; a record of the older kind `C` (no
/// trailers, as a server before this change wrote it) is read as a response without them.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[tokio::test]
async fn redis_keeps_trailers_and_reads_the_older_record_kind() {
    use tower_idempotency_keys::{
        Begin, Entry as StoreEntry, Fingerprint, IdempotencyStore, RedisStore, StoredResponse,
    };
    let redis = crate::support::redis::TestRedis::start("grpc-trailers");
    let store = RedisStore::connect(redis.url())
        .await
        .unwrap()
        .prefix(redis.prefix());
    let fp = Fingerprint::of(&Method::POST, "/lab.v1.Ledger/Append", b"x");
    let Begin::Started(claim) = store.begin("t", fp, Duration::from_secs(30)).await.unwrap() else {
        panic!("free key")
    };
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/grpc"));
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("9"));
    trailers.insert("grpc-message", HeaderValue::from_static("m%20x"));
    trailers.append("x-custom", HeaderValue::from_static("a"));
    trailers.append("x-custom", HeaderValue::from_static("b"));
    let stored = StoredResponse::new(
        http::StatusCode::OK,
        headers.clone(),
        Bytes::from_static(b"\0\0\0\0\x02\x08\x01"),
    )
    .with_trailers(trailers.clone());
    store
        .complete("t", claim, fp, stored, Duration::from_secs(60))
        .await
        .unwrap();
    let Some(StoreEntry::Completed { response, .. }) = store.get("t").await.unwrap() else {
        panic!("completed")
    };
    assert_eq!(response.trailers(), Some(&trailers));
    assert_eq!(response.headers(), &headers);

    // Kind `C`: version 1, kind, token, fingerprint, status, no headers, a 2-byte body.
    let mut old = vec![1u8, b'C'];
    old.extend_from_slice(&7u64.to_be_bytes());
    old.extend_from_slice(fp.as_bytes());
    old.extend_from_slice(&200u16.to_be_bytes());
    old.extend_from_slice(&0u16.to_be_bytes());
    old.extend_from_slice(&2u32.to_be_bytes());
    old.extend_from_slice(b"ok");
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SET")
        .arg(format!("{}old", redis.prefix()))
        .arg(old)
        .query_async(&mut conn)
        .await
        .unwrap();
    let Some(StoreEntry::Completed { response, .. }) = store.get("old").await.unwrap() else {
        panic!("the older record kind is not read")
    };
    assert_eq!(response.body().as_ref(), b"ok");
    assert!(response.trailers().is_none());
    drop(redis);
}

// ---------------------------------------------------------------------------------------
// Errors.
// ---------------------------------------------------------------------------------------

/// The `tonic::Status` made from this crate's error carries no metadata value, no message
/// byte and no key beyond the allowed: only the attempts and whether it may have applied.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[tokio::test]
async fn the_status_of_an_error_carries_no_secrets() {
    let (addr, _lab) = serve().await;
    let mut client = client(addr, builder().build().unwrap()).await;
    let key = format!("KEYSECRET{}", "q".repeat(200));
    let mut req = request(
        Entry {
            id: "sec".into(),
            payload: b"PAYLOADSECRET".to_vec(),
        },
        "sec",
        Some(Fault::ResetAfterApply),
    );
    let md = req.metadata_mut();
    md.insert("authorization", "Bearer TOKENSECRET".parse().unwrap());
    md.insert("x-api-key", "APISECRET".parse().unwrap());
    md.insert("idempotency-key", key.parse().unwrap());
    md.insert("x-request-id", "REQID".parse().unwrap());
    let status = within("sec", client.append(req)).await.unwrap_err();
    let mut text = status.message().to_owned();
    for kv in status.metadata().iter() {
        if let tonic::metadata::KeyAndValueRef::Ascii(k, v) = kv {
            assert!(
                // The mark is this process's random value, not from the request.
                [
                    ATTEMPTS_KEY,
                    MAY_HAVE_BEEN_APPLIED_KEY,
                    tower_retry_safety::grpc::MARK_KEY
                ]
                .contains(&k.as_str()),
                "unexpected metadata {k}"
            );
            text.push_str(v.to_str().unwrap());
        } else {
            panic!("binary metadata in the status");
        }
    }
    text.push_str(&String::from_utf8_lossy(status.details()));
    for secret in ["TOKENSECRET", "APISECRET", "PAYLOADSECRET"] {
        assert!(!text.contains(secret), "{secret} in {text:?}");
    }
    // The key may be named, capped.
    if let Some(at) = text.find("KEYSECRET") {
        let shown = text[at..]
            .chars()
            .take_while(|c| *c == 'q' || c.is_ascii_uppercase())
            .count();
        assert!(
            shown <= 9 + 64,
            "the key is shown whole ({shown} chars): {text:?}"
        );
    }
    assert!(text.len() <= 2048, "{text:?}");
}

// ---------------------------------------------------------------------------------------
// Hot path: non-gRPC requests are unchanged.
// ---------------------------------------------------------------------------------------

/// A non-gRPC request (a GET, and a JSON POST marked idempotent) answered 200 with
/// `content-type: application/grpc` and `grpc-status: 14` is a final 200 as before: one call,
/// no gRPC metadata added, its `grpc-timeout` header untouched. The same answer to a gRPC
/// call of a read is retried (the fixture does trigger).
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[tokio::test]
async fn a_non_grpc_request_is_not_read_as_grpc() {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Vec::<HeaderMap>::new()));
    let svc = {
        let (calls, seen) = (calls.clone(), seen.clone());
        tower::service_fn(move |req: Request<Full<Bytes>>| {
            calls.fetch_add(1, Ordering::SeqCst);
            seen.lock().unwrap().push(req.headers().clone());
            async move {
                let mut res = Response::new(Full::new(Bytes::new()));
                res.headers_mut()
                    .insert("content-type", HeaderValue::from_static("application/grpc"));
                res.headers_mut()
                    .insert("grpc-status", HeaderValue::from_static("14"));
                Ok::<_, std::convert::Infallible>(res)
            }
        })
    };
    let policy = builder()
        .route(Method::POST, "/v1/search", Idempotency::Idempotent)
        .build()
        .unwrap();
    let layered = policy.layer(svc);
    let requests = [
        Request::get("http://svc/lab.v1.Ledger/Count")
            .header("grpc-timeout", "1S")
            .body(Full::new(Bytes::new()))
            .unwrap(),
        Request::post("http://svc/v1/search")
            .header("content-type", "application/json")
            .header("grpc-timeout", "1S")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap(),
    ];
    for req in requests {
        calls.store(0, Ordering::SeqCst);
        seen.lock().unwrap().clear();
        let res = within("http", layered.clone().oneshot(req)).await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(res.status(), http::StatusCode::OK);
        assert!(res.headers().get(ATTEMPTS_KEY).is_none());
        assert!(res.headers().get(MAY_HAVE_BEEN_APPLIED_KEY).is_none());
        assert_eq!(seen.lock().unwrap()[0]["grpc-timeout"], "1S");
    }
    calls.store(0, Ordering::SeqCst);
    let grpc = Request::post("http://svc/lab.v1.Ledger/Count")
        .header("content-type", "application/grpc")
        .body(Full::new(Bytes::from_static(b"\0\0\0\0\0")))
        .unwrap();
    let res = within("grpc", layered.clone().oneshot(grpc)).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3, "a gRPC read is retried");
    assert_eq!(res.headers()[ATTEMPTS_KEY], "3");
}

fn slow_big_stream(
    id: &'static str,
    n: usize,
    size: usize,
) -> impl futures_util::Stream<Item = Entry> + Send {
    futures_util::stream::unfold(0, move |i| async move {
        if i == n {
            return None;
        }
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Some((
            Entry {
                id: id.into(),
                payload: vec![3; size],
            },
            i + 1,
        ))
    })
}

/// The `responded` change with a stream that outgrows the replay buffer (64 KiB) only after
/// the server answered UNAVAILABLE early: the read either recovers with the whole stream
/// (12 messages) or fails after one attempt; it never succeeds on a cut stream, and never
/// hangs.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[tokio::test]
async fn a_stream_answered_early_that_outgrows_the_buffer_is_never_replayed_cut() {
    let (addr, lab) = serve().await;
    let mut client = client(addr, builder().build().unwrap()).await;
    let res = within(
        "sum",
        client.sum(request(
            slow_big_stream("grow", 12, 8 * 1024),
            "grow",
            Some(Fault::UnavailableBefore),
        )),
    )
    .await;
    match res {
        Ok(receipt) => {
            assert_eq!(receipt.get_ref().applied, 1);
            assert_eq!(lab.streamed("grow"), [12], "a cut stream was replayed");
        }
        Err(status) => {
            assert_eq!(lab.attempts("grow").len(), 1, "{status:?}");
            assert!(lab.streamed("grow").is_empty());
        }
    }
}

/// A keyed gRPC write whose answer is over `max_response_bytes`: the layer keeps its head
/// only (`idempotent-replay-body: omitted`), and a repeat of the key replays it. For gRPC
/// that head is a 200 with `content-type: application/grpc`, no message and no
/// `grpc-status`: the client must still learn that the call ran and was not repeated.
///
/// Found by the review, fixed (wrong replay): the replay was a status-less gRPC response; tonic turns it into
/// `UNKNOWN` "protocol error: missing grpc-status trailer, stream was terminated without a
/// final status (possible truncation by a proxy or load balancer)" (counts: applied 1,
/// attempts 2). Nothing in the code or message says the call ran; only the raw
/// `idempotent-replay-body: omitted` header does, and `retry-safety-may-have-been-applied`
/// is absent because `mark_status` only marks a trailers-only failure. Fix: in
/// `server::grpc::answer`, turn a replay with `idempotent-replay-body` (and the "outcome
/// unknown" 500) into a trailers-only status that says the first call ran (e.g. `UNKNOWN`
/// or `DATA_LOSS` with "applied; its answer was too large to keep"), and let the client's
/// `mark_status` see it.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[tokio::test]
async fn a_keyed_answer_too_large_to_keep_replays_as_a_status_that_says_it_ran() {
    let (addr, lab) =
        serve_keyed(IdempotencyLayer::new(MemoryStore::new()).max_response_bytes(4)).await;
    let mut client = client(addr, keyed_builder().build().unwrap()).await;
    let mut req = keyed(entry("big"), "big", "k-big");
    req.metadata_mut().insert(
        "x-fault",
        Fault::UnavailableAfterApply.header().parse().unwrap(),
    );
    let res = within("big", client.append(req)).await;
    assert_eq!(lab.applied("big"), 1);
    assert_eq!(lab.attempts("big").len(), 2);
    let status = res.expect_err("no stored message to replay");
    assert_eq!(
        status
            .metadata()
            .get(MAY_HAVE_BEEN_APPLIED_KEY)
            .map(|v| v.to_str().unwrap().to_owned()),
        Some("true".to_owned()),
        "the replayed call does not say it ran: {status:?}"
    );
}

/// A raw HTTP/2 server that takes each stream (counting it applied), then sends GOAWAY
/// naming that stream as processed and closes without an answer.
async fn serve_goaway() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let applied = Arc::new(AtomicUsize::new(0));
    let counter = applied.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let applied = counter.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(socket).await else {
                    return;
                };
                if let Some(Ok((req, respond))) = conn.accept().await {
                    applied.fetch_add(1, Ordering::SeqCst);
                    conn.abrupt_shutdown(h2::Reason::NO_ERROR);
                    while conn.accept().await.is_some() {}
                    drop((req, respond));
                }
            });
        }
    });
    (addr, applied)
}

/// GOAWAY mid-call, after the server took (applied) the stream: a write is sent once; a read
/// (Count) is retried on a new connection up to its limit (3 attempts).
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[tokio::test]
async fn a_write_cut_by_goaway_after_apply_is_sent_once() {
    let (addr, applied) = serve_goaway().await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let svc = ServiceBuilder::new()
        .map_err(tonic::Status::from as fn(_) -> _)
        .layer(builder().build().unwrap())
        .service(channel);
    let mut client = LedgerClient::new(svc);
    let status = within(
        "goaway write",
        client.append(request(entry("g"), "g", None)),
    )
    .await
    .unwrap_err();
    assert_eq!(applied.load(Ordering::SeqCst), 1, "{status:?}");
    assert_eq!(
        status.metadata().get(MAY_HAVE_BEEN_APPLIED_KEY).unwrap(),
        "true",
        "{status:?}"
    );
    applied.store(0, Ordering::SeqCst);
    let status = within(
        "goaway read",
        client.count(request(CountRequest { id: "g".into() }, "g", None)),
    )
    .await
    .unwrap_err();
    assert_eq!(applied.load(Ordering::SeqCst), 3, "{status:?}");
}

/// A record with trailers (repeated names, a percent-encoded message) round-trips through
/// PostgreSQL (non-atomic `PostgresStore`), as through Redis.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[tokio::test]
async fn postgres_keeps_trailers() {
    use tower_idempotency_keys::{
        Begin, Entry as StoreEntry, Fingerprint, IdempotencyStore, PostgresStore, StoredResponse,
    };
    let db = crate::pg::TestDb::new().await;
    let store = PostgresStore::from_pool(db.pool(2).await);
    store.migrate().await.unwrap();
    let fp = Fingerprint::of(&Method::POST, "/lab.v1.Ledger/Append", b"x");
    let Begin::Started(claim) = store.begin("t", fp, Duration::from_secs(30)).await.unwrap() else {
        panic!("free key")
    };
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("9"));
    trailers.insert("grpc-message", HeaderValue::from_static("m%20x"));
    trailers.append("x-custom", HeaderValue::from_static("a"));
    trailers.append("x-custom", HeaderValue::from_static("b"));
    let stored = StoredResponse::new(http::StatusCode::OK, HeaderMap::new(), Bytes::new())
        .with_trailers(trailers.clone());
    store
        .complete("t", claim, fp, stored, Duration::from_secs(60))
        .await
        .unwrap();
    let Some(StoreEntry::Completed { response, .. }) = store.get("t").await.unwrap() else {
        panic!("completed")
    };
    assert_eq!(response.trailers(), Some(&trailers));
}
