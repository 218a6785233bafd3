//! The proxy's own HTTP/2 serving at its edges: a GOAWAY decided while a long header block is
//! being written, answers without a body, an extreme slow delay. Found by the adversarial
//! review of the GOAWAY faults: each failed on the code as first written.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retry_safety_lab::{Fault, Proxy, ProxyConfig};

use crate::stacks::payment_routes;

use crate::goaway_faults::proxy;
use crate::raw_h2_client::{Frame, RawH2, CONTINUATION, END_HEADERS, GOAWAY, HEADERS};
use crate::raw_upstream::{RawUpstream, Then, GUARD};

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

/// The `content-length` of the answer an HTTP/2 client gets for `method`, when the upstream
/// answers `response` (verbatim).
async fn h2_content_length(method: Method, response: &'static str) -> Option<String> {
    let upstream = RawUpstream::start(vec![Then::Verbatim(response)]).await;
    let proxy = proxy(&upstream.url(), vec![Fault::None]).await;
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let req = Request::builder()
        .method(method)
        .uri(format!("http://{}/v1/payments/1", proxy.addr()))
        .body(Full::new(Bytes::new()))
        .expect("valid request");
    let res = tokio::time::timeout(GUARD, client.request(req))
        .await
        .expect("an answer")
        .expect("an answer");
    assert!(res.status().as_u16() < 300 || res.status().as_u16() == 304);
    res.headers()
        .get(header::CONTENT_LENGTH)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

/// An answer without a body says nothing of its length unless the upstream did: a 204 must
/// not carry one (RFC 9110 §8.6), a 304's or a HEAD answer's would be the length of the
/// representation, which `0` would misstate (a cache could take it). hyper's HTTP/2 server,
/// which the proxy used before, and its HTTP/1.1 server add none.
///
/// Found by review of the GOAWAY faults: the proxy's own HTTP/2 server added
/// `content-length: 0` to every answer without a body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_without_a_body_gets_no_invented_content_length_over_http2() {
    let no_content = "HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n";
    assert_eq!(h2_content_length(Method::DELETE, no_content).await, None);
    let not_modified = "HTTP/1.1 304 Not Modified\r\netag: \"v1\"\r\nconnection: close\r\n\r\n";
    assert_eq!(h2_content_length(Method::GET, not_modified).await, None);
    let chunked = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
    assert_eq!(h2_content_length(Method::HEAD, chunked).await, None);
    // What the upstream said is passed on, and a body's length is given.
    let sized = "HTTP/1.1 200 OK\r\ncontent-length: 100\r\nconnection: close\r\n\r\n";
    assert_eq!(
        h2_content_length(Method::HEAD, sized).await.as_deref(),
        Some("100")
    );
    let chunked_body =
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
    assert_eq!(
        h2_content_length(Method::GET, chunked_body)
            .await
            .as_deref(),
        Some("2")
    );
}

/// A slow delay meant as "forever" (`Duration::MAX`) bounds nothing, but must not break the
/// GOAWAY: the client still gets it and the connection still closes once its streams are
/// done.
///
/// Found by review of the GOAWAY faults: the wait after a GOAWAY (the slow delay plus the
/// linger) overflowed and panicked the connection's task, and the client got no GOAWAY.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_delay_of_duration_max_still_goes_away() {
    let upstream = RawUpstream::start(vec![Then::Reply("200 OK")]).await;
    let config = ProxyConfig::new(&upstream.url())
        .expect("valid upstream")
        .faults(vec![Fault::GoAwayBeforeForwarding])
        .routes(payment_routes())
        .slow(Duration::MAX);
    let proxy = Proxy::start(config, SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .await
        .expect("proxy");
    let mut client = RawH2::connect(proxy.addr()).await;
    client.post(1, "/v1/payments", &[], b"{}").await;
    client.read_to_close().await;
    let goaways: Vec<_> = client
        .of_kind(GOAWAY)
        .iter()
        .filter_map(|f| f.goaway())
        .collect();
    assert_eq!(goaways, vec![(0, 0)], "{:?}", client.frames);
}

/// An HTTP/2 `CONNECT` (RFC 9113 §8.5) opens a tunnel whose bytes are its request body,
/// which never ends: the proxy, a reverse proxy, answers 405 at once rather than waiting for
/// that body (the stream hung until its client gave up), and counts nothing.
///
/// Found by review of the GOAWAY faults (hyper's HTTP/2 server, used before, treated
/// `CONNECT` apart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_over_http2_is_refused_at_once_and_not_counted() {
    let upstream = RawUpstream::start(vec![Then::Reply("200 OK")]).await;
    let lab = proxy(&upstream.url(), vec![Fault::None]).await;
    let tcp = tokio::net::TcpStream::connect(lab.addr())
        .await
        .expect("connect");
    let (mut h2, connection) = h2::client::handshake(tcp).await.expect("handshake");
    tokio::spawn(connection);
    let req = Request::builder()
        .method(Method::CONNECT)
        .uri("upstream.example:443")
        .body(())
        .expect("valid request");
    // The tunnel stays open: no end of stream from the client.
    let (answer, _tunnel) = h2.send_request(req, false).expect("sent");
    let res = tokio::time::timeout(GUARD, answer)
        .await
        .expect("an answer without waiting for the tunnel to end")
        .expect("a response");
    assert_eq!(res.status(), http::StatusCode::METHOD_NOT_ALLOWED);
    assert!(lab.report().routes().is_empty(), "nothing counted");
}
