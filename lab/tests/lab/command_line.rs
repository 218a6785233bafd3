//! The `retry-safety-lab` binary: one-line errors naming the input, and the proxy's exit
//! status after SIGINT.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retry_safety_lab::Upstream;
// A loopback port nothing listens on, below the ephemeral range: no port-0 listener of another
// test takes it before the lab binds it.
use retry_safety_testing::ports::free_port;

const LAB: &str = env!("CARGO_BIN_EXE_retry-safety-lab");

fn run(args: &[&str]) -> Output {
    Command::new(LAB)
        .args(args)
        .output()
        .expect("the binary runs")
}

fn one_line_error(out: &Output, names: &str) {
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let first = stderr.lines().next().unwrap_or_default();
    assert!(first.contains(names), "{stderr}");
}

#[test]
fn bad_input_gets_a_one_line_error_naming_it() {
    let refused = format!("http://127.0.0.1:{}", free_port());
    let out = run(&["proxy", "--upstream", &refused, "--listen", "127.0.0.1:0"]);
    one_line_error(&out, "--upstream");
    assert!(String::from_utf8_lossy(&out.stderr).contains("unreachable"));

    one_line_error(
        &run(&["proxy", "--upstream", "http://127.0.0.1:1", "--op-id", "id"]),
        "--op-id",
    );
    one_line_error(
        &run(&[
            "proxy",
            "--upstream",
            "http://127.0.0.1:1",
            "--write",
            "POST",
        ]),
        "--write",
    );
    one_line_error(
        &run(&[
            "proxy",
            "--upstream",
            "http://127.0.0.1:1",
            "--faults",
            "boom",
        ]),
        "--faults",
    );
    one_line_error(&run(&["proxy", "--listen", "127.0.0.1:0"]), "--upstream");
    for flag in ["--key-header", "--replayed-header"] {
        one_line_error(
            &run(&["proxy", "--upstream", "http://127.0.0.1:1", flag, "a b"]),
            flag,
        );
    }
    one_line_error(
        &run(&[
            "proxy",
            "--upstream",
            "http://127.0.0.1:1",
            "--drain-ms",
            "x",
        ]),
        "--drain-ms",
    );
    one_line_error(&run(&["proxy", "--colour"]), "--colour");
    one_line_error(&run(&["launch"]), "launch");
    one_line_error(&run(&["keys", "--target", "http://127.0.0.1:1"]), "--route");
    // A header line without its name: refused, the line (a credential) not echoed.
    let out = run(&[
        "keys",
        "--target",
        "http://127.0.0.1:1",
        "--route",
        "POST /v1/x",
        "--header",
        "Bearer s3cret-token",
    ]);
    one_line_error(&out, "--header");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("s3cret"),
        "{out:?}"
    );
}

/// A header line not quoted whole (`--header Authorization: "Bearer $TOKEN"`) leaves the
/// credential as a stray argument, and a `--body` without its flag the payload: the error
/// names the argument by position and does not echo it, as it would land in a CI log.
/// Found by review of the keys check's --header/--body.
#[test]
fn a_stray_argument_is_refused_by_position_without_echoing_it() {
    let out = run(&[
        "keys",
        "--target",
        "http://127.0.0.1:1",
        "--route",
        "POST /v1/x",
        "--header",
        "Authorization:",
        "Bearer s3cret-token",
    ]);
    one_line_error(&out, "argument 8");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("s3cret"), "{stderr}");
    let out = run(&[
        "keys",
        "--target",
        "http://127.0.0.1:1",
        "{\"card\":\"s3cret-4242\"}",
    ]);
    one_line_error(&out, "argument 4");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("s3cret"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_in_use_is_named() {
    let upstream = Upstream::start(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .await
        .expect("upstream");
    // The upstream's own port is in use.
    let out = run(&[
        "proxy",
        "--upstream",
        &format!("http://{}", upstream.addr()),
        "--listen",
        &upstream.addr().to_string(),
    ]);
    one_line_error(&out, "--listen");
}

/// The proxy's process, killed if the test ends before it interrupts it (a failed assertion).
struct ProxyProcess(Option<Child>);

impl ProxyProcess {
    /// SIGINT, as ctrl-c sends; then its output.
    fn interrupt(mut self) -> Output {
        let child = self.0.take().expect("running");
        let killed = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(killed.success());
        child.wait_with_output().expect("the proxy ends")
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_prints_its_counts_on_sigint_and_fails_when_a_write_was_applied_twice() {
    let upstream = Upstream::start(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .await
        .expect("upstream");
    let listen = format!("127.0.0.1:{}", free_port());
    let child = ProxyProcess(Some(
        Command::new(LAB)
            .args([
                "proxy",
                "--upstream",
                &format!("http://{}", upstream.addr()),
                "--listen",
                &listen,
                "--faults",
                "none,503-after-apply,429-before-apply",
                "--json",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts"),
    ));
    // Up when it accepts a connection; bounded, so a broken binary fails the test.
    let mut up = false;
    for _ in 0..600 {
        if tokio::net::TcpStream::connect(&listen).await.is_ok() {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    if up {
        // Three writes, each resent once after a 5xx or 429, as a naive client does.
        for op in 0..3 {
            for _ in 0..2 {
                let req = Request::post(format!("http://{listen}/v1/charges"))
                    .body(Full::new(Bytes::from(format!("{{\"op\":{op}}}"))))
                    .expect("valid request");
                let res = client.request(req).await.expect("an answer");
                let status = res.status();
                let _ = res.into_body().collect().await;
                if status.is_success() {
                    break;
                }
            }
        }
    }
    let out = child.interrupt();
    assert!(up, "the proxy never listened: {out:?}");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(json["writes"], 3);
    assert_eq!(json["applied_twice"], 1);
    assert_eq!(json["writes_answered"], 3);
    assert_eq!(json["pass"], false);
    assert_eq!(json["routes"][0]["route"], "POST (any path)");
    assert_eq!(json["routes"][0]["attempts"], 5);
    assert_eq!(upstream.handler_runs(), 4);
}

/// `--version`: what the Python and npm packages' version checks compare with the crate's.
#[test]
fn version_prints_the_crates_version() {
    let out = run(&["--version"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("retry-safety-lab {}\n", env!("CARGO_PKG_VERSION"))
    );
}

/// `--stop-on-stdin-close`: a harness stops the lab by closing its stdin, on any OS (Windows
/// has no SIGTERM to send), and a harness that dies takes the lab with it. The proxy prints
/// its counts as on SIGTERM; `serve` stops.
#[test]
fn stdin_closing_stops_the_proxy_with_its_counts_and_the_upstream() {
    use std::io::{BufRead as _, BufReader};
    let start = |args: &[&str]| {
        let mut child = Command::new(LAB)
            .args(args)
            .arg("--stop-on-stdin-close")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts");
        // The announced address: `--listen 127.0.0.1:0` takes a free port.
        let mut line = String::new();
        BufReader::new(child.stderr.as_mut().expect("piped"))
            .read_line(&mut line)
            .expect("a line on stderr");
        let url = line
            .split("listening on ")
            .nth(1)
            .and_then(|rest| rest.split(';').next())
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_owned();
        (ProxyProcess(Some(child)), url)
    };
    let (upstream, upstream_url) = start(&["serve", "--listen", "127.0.0.1:0"]);
    let (proxy, _) = start(&[
        "proxy",
        "--upstream",
        &upstream_url,
        "--listen",
        "127.0.0.1:0",
        "--json",
    ]);
    for mut process in [proxy, upstream] {
        drop(process.0.as_mut().and_then(|child| child.stdin.take()));
        let child = process.0.take().expect("running");
        let out = child.wait_with_output().expect("it ends");
        if out.stdout.is_empty() {
            assert_eq!(out.status.code(), Some(0), "serve: {out:?}");
        } else {
            // No write reached the proxy: nothing was verified, so it fails.
            assert_eq!(out.status.code(), Some(1), "proxy: {out:?}");
            let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
            assert_eq!(json["writes"], 0);
            assert_eq!(json["pass"], false);
        }
    }
}
