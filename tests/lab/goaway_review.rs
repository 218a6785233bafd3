//! Defects an adversarial review of the HTTP/2 GOAWAY faults found, kept as tests: each
//! failed on the code as first written.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tower_retry_safety::lab::{demo_routes, Fault, Proxy, ProxyConfig};

use crate::raw_h2_client::{Frame, RawH2, CONTINUATION, END_HEADERS, GOAWAY, HEADERS};
use crate::raw_upstream::{RawUpstream, Then, GUARD};

async fn proxy(upstream: &str, faults: Vec<Fault>) -> Proxy {
    let config = ProxyConfig::new(upstream)
        .expect("valid upstream")
        .faults(faults)
        .routes(demo_routes())
        .slow(Duration::from_secs(20));
    Proxy::start(config, SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .await
        .expect("proxy")
}

/// Waits until the proxy's books say `done`.
async fn until(proxy: &Proxy, done: impl Fn(&Proxy) -> bool) {
    tokio::time::timeout(GUARD, async {
        while !done(proxy) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the proxy gets there");
}

/// Where a header block (HEADERS without END_HEADERS, then CONTINUATIONs) is interrupted by
/// another frame, which a client must take as a connection error (RFC 9113 §6.10).
fn split_header_block(frames: &[Frame]) -> Option<usize> {
    let mut open: Option<u32> = None;
    for (i, f) in frames.iter().enumerate() {
        match open {
            Some(stream) if f.kind != CONTINUATION || f.stream != stream => return Some(i),
            _ => {}
        }
        let block = f.kind == HEADERS || f.kind == CONTINUATION;
        open = (block && f.flags & END_HEADERS == 0).then_some(f.stream);
    }
    None
}

/// Answers whose header blocks are far larger than a frame go out as HEADERS and
/// CONTINUATIONs; a GOAWAY decided while one is being written (here: the client has stopped
/// reading, so the proxy's writes back up, most likely in the middle of a block) must wait
/// for the block's end, not just the frame's. Three connections, so that a block is cut on
/// at least one of them whatever the sockets hold.
///
/// Found by review of the GOAWAY faults: the filter put the lab's GOAWAY between a HEADERS
/// frame and its CONTINUATION, a protocol error that fails every stream of the connection,
/// the forwarded ones included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_goaway_never_splits_a_header_block() {
    // 380 KB of header (the proxy's HTTP/1.1 client reads up to about 400 KB): some 600 KB
    // once HPACK-coded, about 40 frames; eight answers, more than loopback sockets hold.
    const ANSWERS: u32 = 8;
    let big: &'static str = Box::leak(format!("200 OK\r\nx-big: {}", "~".repeat(380_000)).into());
    for _ in 0..3 {
        let upstream = RawUpstream::start(vec![Then::Reply(big)]).await;
        let mut faults = vec![Fault::None; ANSWERS as usize];
        faults.push(Fault::GoAwayBeforeForwarding);
        let proxy = proxy(&upstream.url(), faults).await;
        let mut client = RawH2::connect_with_small_buffer(proxy.addr()).await;
        // The client reads nothing while the answers are written.
        for n in 0..ANSWERS {
            let id = 2 * n + 1;
            let body = format!("{{\"op\":{id}}}");
            client.post(id, "/v1/payments", &[], body.as_bytes()).await;
        }
        upstream.wait_received(ANSWERS).await;
        until(&proxy, |p| {
            p.report()
                .routes()
                .first()
                .is_some_and(|r| r.answered_ok == u64::from(ANSWERS))
        })
        .await;
        // Time for the proxy to write until the sockets are full (nothing depends on it).
        tokio::time::sleep(Duration::from_millis(200)).await;
        let faulted = 2 * ANSWERS + 1;
        client.post(faulted, "/v1/payments", &[], b"{}").await;
        until(&proxy, |p| {
            p.report()
                .routes()
                .first()
                .is_some_and(|r| r.failed_provably_unsent == 1)
        })
        .await;
        // The GOAWAY is decided just after the count (a few instructions on).
        tokio::time::sleep(Duration::from_millis(100)).await;
        client.read_to_close().await;
        let kinds: Vec<(u8, u32)> = client.frames.iter().map(|f| (f.kind, f.stream)).collect();
        assert_eq!(split_header_block(&client.frames), None, "{kinds:?}");
        for n in 0..ANSWERS {
            let id = 2 * n + 1;
            assert!(client.body(id).is_some(), "stream {id} answered: {kinds:?}");
        }
        let goaways: Vec<_> = client
            .of_kind(GOAWAY)
            .iter()
            .filter_map(|f| f.goaway())
            .collect();
        assert_eq!(goaways, vec![(faulted - 2, 0)]);
    }
}
