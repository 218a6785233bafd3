//! What each GOAWAY fault tells a raw HTTP/2 client, frame by frame: `goaway-before-forwarding`
//! sends a last-stream-id below the faulted stream (not processed: the upstream never sees
//! it), or covering it when a higher stream was already forwarded; `goaway-after-apply` one
//! that covers it and closes without its answer. Streams already forwarded are answered
//! before the connection closes; a covered stream not yet forwarded is refused.

use retry_safety_lab::{Fault, Upstream};

use super::{goaways, loopback, proxy};
use crate::raw_h2_client::{RawH2, DATA, GOAWAY, HEADERS, RST_STREAM};
use crate::raw_upstream::{RawUpstream, Then};

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
    let held = Then::HeldThenOk { stored: false };
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
    let upstream = RawUpstream::start(vec![Then::HeldThenOk { stored: false }]).await;
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
    let upstream = RawUpstream::start(vec![Then::HeldThenOk { stored: false }]).await;
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
    let held = Then::HeldThenOk { stored: false };
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
