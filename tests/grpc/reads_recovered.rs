//! Reads recovered (the adversarial review of the gRPC support, issue 24): UNAVAILABLE before
//! apply on a read is retried with the caller's `grpc-timeout` cut to the time left and the
//! previous attempts counted, a long or negative pushback ends the retries, and a stream
//! answered early that outgrows the replay buffer is never replayed cut.
#![cfg(feature = "tonic")]

use std::time::Duration;

use http::HeaderValue;
use retry_safety_testing::grpc::lab::{CountRequest, Entry};
use retry_safety_testing::grpc::misbehaving_server::{
    builder, client, entry, rev_request, serve_rev, within,
};
use retry_safety_testing::grpc::{request, serve, Fault};
use tonic::Code;

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
        // Attempts that may last longer than the call: what each carries is the time left
        // (an attempt's `grpc-timeout` is the earlier of its own timeout and the call's).
        builder()
            .attempt_timeout(Duration::from_secs(60))
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
