//! gRPC through the layer on a real tonic `Channel`, against a real tonic server on
//! 127.0.0.1 whose handler counts what it applies; faults break each call's first attempt
//! before or after the handler applied it.
#![cfg(feature = "tonic")]

use std::time::Duration;

use http::Method;
use retry_safety_testing::grpc::lab::ledger_client::LedgerClient;
use retry_safety_testing::grpc::lab::{CountRequest, Entry};
use retry_safety_testing::grpc::{channel, request, serve, Fault};
use tonic::Code;
use tower::ServiceBuilder;
use tower_retry_safety::grpc::{ATTEMPTS_KEY, MAY_HAVE_BEEN_APPLIED_KEY};
use tower_retry_safety::{Idempotency, RetryPolicy, RetryPolicyBuilder};

fn builder() -> RetryPolicyBuilder {
    RetryPolicy::builder()
        .jitter(false)
        .backoff(Duration::from_millis(5), Duration::from_millis(20))
        .max_retries(2)
        .attempt_timeout(Duration::from_secs(1))
        .grpc_descriptors(&retry_safety_testing::grpc::descriptor_set())
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

fn attempts_of(status: &tonic::Status) -> Option<&str> {
    status.metadata().get(ATTEMPTS_KEY)?.to_str().ok()
}

#[tokio::test]
async fn a_read_by_its_proto_option_recovers_from_every_fault() {
    let (addr, lab) = serve().await;
    let mut client = client(addr, builder().build().unwrap()).await;
    let faults = [
        Fault::UnavailableAfterApply,
        Fault::UnavailableBefore,
        Fault::ResourceExhaustedBefore,
        Fault::ResetAfterApply,
        Fault::SlowAfterApply(Duration::from_secs(3)),
    ];
    for (i, fault) in faults.into_iter().enumerate() {
        let id = format!("read-{i}");
        let req = request(CountRequest { id: id.clone() }, &id, Some(fault));
        let res = client.count(req).await;
        assert!(res.is_ok(), "{fault:?}: {res:?}");
        assert_eq!(lab.attempts(&id).len(), 2, "{fault:?}");
        let second = &lab.attempts(&id)[1];
        assert_eq!(second["grpc-previous-rpc-attempts"], "1", "{fault:?}");
        assert_eq!(lab.attempts(&id)[0].get("grpc-previous-rpc-attempts"), None);
    }
}

#[tokio::test]
async fn a_write_that_may_have_been_applied_is_never_sent_again() {
    let (addr, lab) = serve().await;
    let mut client = client(addr, builder().build().unwrap()).await;
    let cases = [
        (Fault::UnavailableAfterApply, Code::Unavailable, 1),
        (Fault::UnavailableBefore, Code::Unavailable, 0),
        (Fault::ResourceExhaustedBefore, Code::ResourceExhausted, 0),
        (Fault::ResetAfterApply, Code::Unknown, 1),
        (
            Fault::SlowAfterApply(Duration::from_secs(3)),
            Code::DeadlineExceeded,
            1,
        ),
    ];
    for (i, (fault, code, applied)) in cases.into_iter().enumerate() {
        let id = format!("write-{i}");
        let status = client
            .append(request(entry(&id), &id, Some(fault)))
            .await
            .unwrap_err();
        assert_eq!(status.code(), code, "{fault:?}: {status:?}");
        assert_eq!(lab.attempts(&id).len(), 1, "{fault:?}");
        assert_eq!(lab.applied(&id), applied, "{fault:?}");
    }
    // The errors (not the server's own statuses) say so, with the attempts.
    let status = client
        .append(request(
            entry("w-reset"),
            "w-reset",
            Some(Fault::ResetAfterApply),
        ))
        .await
        .unwrap_err();
    assert_eq!(attempts_of(&status), Some("1"));
    assert_eq!(
        status.metadata().get(MAY_HAVE_BEEN_APPLIED_KEY).unwrap(),
        "true"
    );
    assert!(
        status.message().contains("may have been applied"),
        "{status:?}"
    );
    assert!(
        !status.message().contains("w-reset"),
        "no metadata value in the message"
    );
    assert_eq!(lab.applied("w-reset"), 1);
    assert_eq!(lab.applied_twice(), 0);
}

#[tokio::test]
async fn a_write_marked_idempotent_by_a_rule_is_repeated() {
    let (addr, lab) = serve().await;
    let policy = builder()
        .route(
            Method::POST,
            "/lab.v1.Ledger/Append",
            Idempotency::Idempotent,
        )
        .build()
        .unwrap();
    let mut client = client(addr, policy).await;
    let res = client
        .append(request(
            entry("ruled"),
            "ruled",
            Some(Fault::UnavailableAfterApply),
        ))
        .await
        .unwrap();
    // The rule says a repeat is harmless: the server applied it twice, as told.
    assert_eq!(res.get_ref().applied, 2);
    assert_eq!(lab.attempts("ruled").len(), 2);
    // Put is IDEMPOTENT in the proto.
    client
        .put(request(entry("put"), "put", Some(Fault::ResetAfterApply)))
        .await
        .unwrap();
    assert_eq!(lab.attempts("put").len(), 2);
}

#[tokio::test]
async fn a_marker_in_the_request_extensions_decides_as_for_http() {
    let (addr, lab) = serve().await;
    let mut client = client(addr, builder().build().unwrap()).await;
    let mut req = request(
        CountRequest {
            id: "marked".into(),
        },
        "marked",
        Some(Fault::UnavailableAfterApply),
    );
    req.extensions_mut().insert(Idempotency::NonIdempotent);
    let status = client.count(req).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(lab.attempts("marked").len(), 1);
}

#[tokio::test]
async fn a_negative_pushback_stops_the_retries() {
    let (addr, lab) = serve().await;
    let mut client = client(addr, builder().build().unwrap()).await;
    let req = request(
        CountRequest {
            id: "pushed".into(),
        },
        "pushed",
        Some(Fault::UnavailableDoNotRetry),
    );
    let status = client.count(req).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(lab.attempts("pushed").len(), 1);
}

#[tokio::test]
async fn each_attempt_carries_the_time_left_as_its_grpc_timeout() {
    let (addr, lab) = serve().await;
    // Attempts that may last longer than the call: what each carries is the time left (an
    // attempt's `grpc-timeout` is the earlier of its own timeout and the call's).
    let policy = builder()
        .attempt_timeout(Duration::from_secs(60))
        .deadline(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut client = client(addr, policy).await;
    let mut req = request(
        CountRequest { id: "timed".into() },
        "timed",
        Some(Fault::UnavailableBefore),
    );
    // The caller's own timeout is shorter than the policy's deadline: it wins.
    req.set_timeout(Duration::from_secs(3));
    client.count(req).await.unwrap();
    let attempts = lab.attempts("timed");
    assert_eq!(attempts.len(), 2);
    let timeout = |h: &http::HeaderMap| {
        let text = h["grpc-timeout"].to_str().unwrap().to_owned();
        let (digits, unit) = text.split_at(text.len() - 1);
        let n: u64 = digits.parse().unwrap();
        match unit {
            "n" => Duration::from_nanos(n),
            "u" => Duration::from_micros(n),
            "m" => Duration::from_millis(n),
            "S" => Duration::from_secs(n),
            other => panic!("unit {other}"),
        }
    };
    let (first, second) = (timeout(&attempts[0]), timeout(&attempts[1]));
    assert!(first <= Duration::from_secs(3), "{first:?}");
    assert!(second < first, "{second:?} then {first:?}");
}

#[tokio::test]
async fn a_client_stream_is_replayed_whole_within_the_buffer_and_sent_once_past_it() {
    let (addr, lab) = serve().await;
    let mut client = client(addr, builder().build().unwrap()).await;
    let stream = |id: &str, n: usize, size: usize| {
        let entries: Vec<Entry> = (0..n)
            .map(|_| Entry {
                id: id.into(),
                payload: vec![1; size],
            })
            .collect();
        tokio_stream_iter(entries)
    };
    // A read (NO_SIDE_EFFECTS) of 5 small messages: recorded, and replayed whole.
    let res = client
        .sum(request(
            stream("sum", 5, 100),
            "sum",
            Some(Fault::UnavailableAfterApply),
        ))
        .await
        .unwrap();
    assert_eq!(res.get_ref().applied, 2);
    assert_eq!(lab.streamed("sum"), [5, 5]);
    // A write stream: never sent twice.
    let status = client
        .upload(request(
            stream("up", 5, 100),
            "up",
            Some(Fault::UnavailableAfterApply),
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(lab.applied("up"), 1);
    assert_eq!(lab.attempts("up").len(), 1);
    // A read past the replay buffer (64 KiB by default): sent once, not retried.
    let status = client
        .sum(request(
            stream("big", 20, 8 * 1024),
            "big",
            Some(Fault::UnavailableAfterApply),
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(lab.streamed("big"), [20]);
    assert_eq!(lab.attempts("big").len(), 1);
}

/// The server answers UNAVAILABLE before it reads the stream, while the client is still
/// sending it: the call is over, so the recording is replayed once the transport gives it
/// back (an HTTP response before the body's end is not replayed).
#[tokio::test]
async fn a_stream_answered_before_its_end_is_replayed() {
    let (addr, lab) = serve().await;
    let mut client = client(addr, builder().build().unwrap()).await;
    let slow_stream = futures_util::stream::unfold(0, |i| async move {
        if i == 4 {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
        Some((entry("early"), i + 1))
    });
    let res = client
        .sum(request(
            slow_stream,
            "early",
            Some(Fault::UnavailableBefore),
        ))
        .await
        .unwrap();
    assert_eq!(res.get_ref().applied, 1);
    assert_eq!(lab.attempts("early").len(), 2);
    assert_eq!(lab.streamed("early"), [4]);
}

fn tokio_stream_iter(
    entries: Vec<Entry>,
) -> impl futures_util::Stream<Item = Entry> + Send + 'static {
    futures_util::stream::iter(entries)
}

#[tokio::test]
async fn a_write_that_never_left_is_sent_again_and_the_status_says_so() {
    // A port nothing listens on: every attempt is refused before anything is sent.
    let addr = retry_safety_testing::fault_server::refused_addr().await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let svc = ServiceBuilder::new()
        .map_err(tonic::Status::from as fn(_) -> _)
        .layer(builder().build().unwrap())
        .service(channel);
    let mut client = LedgerClient::new(svc);
    let status = client
        .append(request(entry("refused"), "refused", None))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(attempts_of(&status), Some("3"), "{status:?}");
    assert_eq!(
        status.metadata().get(MAY_HAVE_BEEN_APPLIED_KEY).unwrap(),
        "false"
    );
}

/// A failed status the server answered carries the report's gist in its metadata: a
/// suppressed write says it may have been applied, a read that ran out of retries says how
/// many attempts it took.
#[tokio::test]
async fn a_servers_failed_status_carries_the_attempts_and_whether_it_may_have_applied() {
    let (addr, _lab) = serve().await;
    let mut client = client(addr, builder().build().unwrap()).await;
    let status = client
        .append(request(
            entry("gist"),
            "gist",
            Some(Fault::UnavailableAfterApply),
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(attempts_of(&status), Some("1"));
    assert_eq!(
        status.metadata().get(MAY_HAVE_BEEN_APPLIED_KEY).unwrap(),
        "true"
    );
    let ok = client
        .count(request(CountRequest { id: "fine".into() }, "fine", None))
        .await
        .unwrap();
    assert!(ok.metadata().get(ATTEMPTS_KEY).is_none());
}

/// The caller's own timeout (`Request::set_timeout`) is the call's deadline: a handler slower
/// than it ends the call with DEADLINE_EXCEEDED after one attempt, read or write, since no
/// time is left for another.
#[tokio::test]
async fn a_handler_slower_than_the_callers_deadline_ends_the_call() {
    let (addr, lab) = serve().await;
    let mut client = client(addr, builder().build().unwrap()).await;
    let mut read = request(
        CountRequest {
            id: "late-r".into(),
        },
        "late-r",
        Some(Fault::SlowAfterApply(Duration::from_secs(3))),
    );
    read.set_timeout(Duration::from_millis(400));
    let status = client.count(read).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(attempts_of(&status), Some("1"));
    assert_eq!(lab.attempts("late-r").len(), 1);

    let mut write = request(
        entry("late-w"),
        "late-w",
        Some(Fault::SlowAfterApply(Duration::from_secs(3))),
    );
    write.set_timeout(Duration::from_millis(400));
    let status = client.append(write).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(
        status.metadata().get(MAY_HAVE_BEEN_APPLIED_KEY).unwrap(),
        "true"
    );
    assert_eq!(lab.attempts("late-w").len(), 1);
    assert_eq!(lab.applied("late-w"), 1);
}
