//! Never twice (the adversarial review of the gRPC support, issue 24), against real tonic
//! servers on 127.0.0.1 that count side effects: a write the handler applied, then answered
//! any retryable status however spelled, reset, or cut by GOAWAY, is sent once; messages then
//! a failing status commit the call; a stream write applied in part is not replayed. No gRPC
//! write without a trusted key was sent twice.
#![cfg(feature = "tonic")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use retry_safety_testing::grpc::lab::ledger_client::LedgerClient;
use retry_safety_testing::grpc::lab::{CountRequest, Entry};
use retry_safety_testing::grpc::misbehaving_server::{
    builder, client, entry, rev_request, serve_rev, within,
};
use retry_safety_testing::grpc::{request, serve, Fault};
use tonic::Code;
use tower::ServiceBuilder;
use tower_retry_safety::grpc::MAY_HAVE_BEEN_APPLIED_KEY;

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
