//! HTTP/1.1 pipelining: a client that sent two requests at once and closed its connection
//! is given nothing, and the lab counts no answer as received.

use std::net::{Ipv4Addr, SocketAddr};

use retry_safety_lab::{Fault, Proxy, ProxyConfig};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::raw_upstream::{RawUpstream, Then, GUARD};

fn post(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: lab\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Two writes pipelined on one connection, which the client closes while the first is at
/// the upstream: hyper does not read the close behind the buffered second request, so the
/// first's 2xx was counted as answered when it was written into a closed connection, and
/// the second was forwarded and its 2xx counted too. Now the proxy sees the client gone
/// before it counts an answer, gives none, and closes: the first write counts as sent with
/// no answer received, and the second is never read. Issue 41 item 16, real SDKs through
/// the lab.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelined_write_behind_a_closed_connection_counts_no_answer_received() {
    let upstream = RawUpstream::start(vec![
        Then::HeldThenOk { replayed: false },
        Then::Reply("201 Created"),
    ])
    .await;
    let config = ProxyConfig::new(&upstream.url())
        .expect("valid upstream")
        .faults(vec![Fault::None]);
    let proxy = Proxy::start(config, SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .await
        .expect("proxy");
    let mut client = TcpStream::connect(proxy.addr()).await.expect("connect");
    let both = post("/v1/a", "{\"op\":1}") + &post("/v1/b", "{\"op\":2}");
    client.write_all(both.as_bytes()).await.expect("written");
    upstream.wait_received(1).await;
    drop(client);
    upstream.release(0);
    tokio::time::timeout(GUARD, async {
        while proxy.open_connections() > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the proxy ends the connection");
    let report = proxy.report();
    assert_eq!(report.writes_answered(), 0, "{}", report.table(0));
    assert_eq!(report.writes(), 1, "{}", report.table(0));
    assert_eq!(report.routes()[0].failed_after_upstream, 1);
    assert_eq!(upstream.received(), 1);
}
