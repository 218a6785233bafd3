//! The `retry-safety-lab` command line (the binary's, not the library's): arguments parsed
//! by hand (no parser dependency), each error a line naming the argument.
//!
//! # The commands
//!
//! - **`proxy --upstream URL`**: a reverse proxy ([`Proxy`](retry_safety_lab::Proxy)) the client
//!   under test is pointed at. Each operation's first attempt gets one
//!   [`Fault`](retry_safety_lab::Fault) from a mix given out in turn per route (by default: none;
//!   response lost after the upstream applied the write; answer held after apply; 503 after apply;
//!   429 before apply; 500 before apply; on request, a reset before forwarding, HTTP/2's
//!   `REFUSED_STREAM`, and an HTTP/2 `GOAWAY` before forwarding or after apply), and later attempts
//!   pass through. Attempts are linked into operations as a client repeats them
//!   ([`OpIdentity`](retry_safety_lab::op_id::OpIdentity), whose module docs hold the design): by
//!   `--op-header` (a value the harness sets per call) when present, else by `Idempotency-Key` (or
//!   `--key-header`), else by method, path and body (a multipart body without its boundary;
//!   `--op-id /json/pointer` for a value in the body); a resend with a new key is linked by its
//!   content to an operation not yet answered 2xx, and counted *uncertain*. Writes and reads are
//!   told apart by method and by `--write` / `--read` rules in tower-retry-safety's route syntax
//!   ([`RouteKinds`](retry_safety_lab::routes::RouteKinds)). On SIGINT or SIGTERM it stops
//!   forwarding, waits for requests still at the upstream (`--drain-ms`), prints a
//!   [`ProxyReport`](retry_safety_lab::ProxyReport) per route (`--json` for machines) and exits 1
//!   when more writes than `--max-applied-twice` (default 0) may have been applied twice, when no
//!   write reached it (nothing was verified), or when a request was refused for a body over
//!   `--max-body` (never checked).
//! - **`serve`**: an [`Upstream`](retry_safety_lab::Upstream) for a quick try: any route answers a
//!   small JSON body, behind tower-idempotency-keys'
//!   [`IdempotencyLayer`](tower_idempotency_keys::IdempotencyLayer) over the memory store.
//! - **`demo`**: upstream, proxy and clients in one process on loopback: `tower::retry` with a
//!   typical policy applies writes twice, tower-retry-safety's layer none.
//! - **`keys --target URL --route 'POST /v1/payments'`**: a conformance check
//!   ([`KeysCheck`](retry_safety_lab::KeysCheck)) for a server that honours `Idempotency-Key`: a
//!   malformed key gets 400, a key in flight 409, a key reused with another payload 422, a repeat
//!   the first answer (status, body, `content-type`, `location`, `content-location`, `etag`),
//!   concurrent requests with one key run the handler once, a repeat after the handler failed does
//!   not run it again, a key differing only in case is another key, and the first key sent again
//!   after `--keep-ms` (3 s) still gets its first answer. `--header 'NAME: VALUE'` (credentials,
//!   never shown) and `--body` (the API's own payload, `{variant}` made different per request) let
//!   it run against a real API. The check passes only when no rule failed and the run-once rules
//!   (in flight, repeat, concurrent, after a failure) were each tried and kept: a skipped one
//!   verified nothing.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use retry_safety_lab::op_id::OpIdentity;
use retry_safety_lab::routes::{RouteKind, RouteKinds};
use retry_safety_lab::{Fault, KeysCheck, Proxy, ProxyConfig, Upstream};

use self::demo::{demo_holds, demo_table, run_demo, OPS};
use self::error::CliError;

mod demo;
mod error;

/// The usage text of `retry-safety-lab help`.
pub(crate) const USAGE: &str = "\
retry-safety-lab: a fault lab for HTTP clients, and a conformance check for servers that honour keys

USAGE
  retry-safety-lab proxy --upstream URL [--listen ADDR] [--faults LIST] [--op-header NAME]
                         [--op-id /json/pointer] [--write 'POST /v1/{*rest}']... [--read 'GET /v1/{id}']...
                         [--slow-ms N] [--max-body BYTES] [--json] [--max-applied-twice N] [--drain-ms N]
                         [--key-header NAME] [--replayed-header NAME] [--stop-on-stdin-close]
      Forward to URL; fault each operation's first attempt; on SIGINT (ctrl-c) or SIGTERM stop
      forwarding, wait up to --drain-ms (default 5000) for requests still at the upstream, print
      the counts per route and exit 1 if more writes than N (default 0) may have been applied twice
      (an attempt counts from the moment it is handed to the upstream, answered or not; an answer
      marked with --replayed-header (default idempotent-replayed: true), a 400/409/422 to a
      request with --key-header (default idempotency-key), or a 429 ran nothing); exit 1 too when
      no write reached it (nothing was verified) or a body was refused over --max-body.
      Operations: attempts with one --op-header value (set by your harness per call; when
      present it alone decides), else one key, else one method, path and body (a multipart body
      without its boundary, which SDKs draw per attempt; --op-id: a JSON value in the body). A
      resend with a new key is linked by its body to an operation not yet answered 2xx and
      counted uncertain (two calls with one body look alike: --op-header tells them apart).
      A resend whose key and body both change is not linked without --op-header or --op-id.
      --listen defaults to 127.0.0.1:8080; --faults to the six of the default mix:
      none,drop-after-apply,slow-after-apply,503-after-apply,429-before-apply,500-before-apply
      (also: reset-before-forwarding, refused-stream, goaway-before-forwarding,
      goaway-after-apply: the last three HTTP/2's, connection closes for HTTP/1.1);
      --slow-ms to 30000. --stop-on-stdin-close: stdin's end stops it as SIGTERM does (a test
      harness closes the pipe, on any OS, or dies: the lab never outlives it).
  retry-safety-lab serve [--listen ADDR] [--stop-on-stdin-close]
      An upstream answering any route with a small JSON body, honouring Idempotency-Key
      (this crate's IdempotencyLayer, in memory). --listen defaults to 127.0.0.1:4010.
  retry-safety-lab demo
      Upstream, proxy and clients in one process: this crate's stacks and tower::retry.
  retry-safety-lab keys --target URL --route 'POST /v1/payments' [--concurrency N] [--hold-ms N]
          [--header 'NAME: VALUE']... [--body TEXT] [--keep-ms N]
      Check that the server at URL honours Idempotency-Key on that route; exit 1 on a failure,
      or when a run-once rule (in-flight-409, repeat-same-answer, concurrent-run-once,
      repeat-after-failure) could not be tried: it needs x-lab-hold-ms, x-lab-fail and the
      x-lab-handler-run answer header (see `serve`); a repeat held until the first ends fails,
      as do a key compared without case and a key forgotten before --keep-ms (default 3000). --header is sent with every
      request (credentials; never printed); --body replaces the check's own JSON, each
      {variant} in it made different per request (without one, the other-payload rule skips).

  retry-safety-lab --version
      Prints `retry-safety-lab VERSION`.

Exit status: 0 pass, 1 a check failed, 2 bad input.
";

/// Runs the command line (`args` without the program name); the process's exit status.
pub(crate) fn main_with_args<I>(args: I) -> ExitCode
where
    I: IntoIterator<Item = OsString>,
{
    let command = match parse(args) {
        Ok(command) => command,
        Err(err) => {
            eprintln!("retry-safety-lab: {err}\n(run `retry-safety-lab help` for usage)");
            return ExitCode::from(2);
        }
    };
    if let Command::Help = command {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if let Command::Version = command {
        println!("retry-safety-lab {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("retry-safety-lab: cannot start the runtime: {err}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(command)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(err) => {
            eprintln!("retry-safety-lab: {err}");
            ExitCode::from(2)
        }
    }
}

#[derive(Debug)]
enum Command {
    Help,
    Version,
    Proxy {
        config: Box<ProxyConfig>,
        listen: SocketAddr,
        json: bool,
        max_applied_twice: u64,
        drain: Duration,
        stdin_stops: bool,
    },
    Serve {
        listen: SocketAddr,
        stdin_stops: bool,
    },
    Demo,
    Keys {
        check: Box<KeysCheck>,
    },
}

/// The arguments after the subcommand, taken flag by flag.
struct Args {
    rest: std::vec::IntoIter<String>,
    /// The position of the next argument on the command line, numbered as the "not valid
    /// UTF-8" error numbers them (the subcommand is argument 1).
    position: usize,
}

impl Args {
    /// The next flag and its value, if it takes one (`--flag VALUE` or `--flag=VALUE`).
    fn next_flag(
        &mut self,
        takes_value: &dyn Fn(&str) -> bool,
    ) -> Result<Option<(String, String)>, CliError> {
        let Some(arg) = self.rest.next() else {
            return Ok(None);
        };
        let position = self.position;
        self.position += 1;
        if !arg.starts_with("--") {
            // Named by position, not echoed: a stray argument is often a value split off its
            // flag (`--header Authorization: "Bearer $TOKEN"` unquoted, a `--body` without
            // its flag), and may be a credential that would land in a CI log.
            return Err(CliError::new(
                format!("argument {position}"),
                "unexpected argument, not shown (flags start with --; a value with spaces must be quoted whole, as in --header 'NAME: VALUE')",
            ));
        }
        if let Some((flag, value)) = arg.split_once('=') {
            return Ok(Some((flag.to_owned(), value.to_owned())));
        }
        if !takes_value(&arg) {
            return Ok(Some((arg, String::new())));
        }
        let value = self
            .rest
            .next()
            .ok_or_else(|| CliError::new(arg.clone(), "needs a value"))?;
        self.position += 1;
        Ok(Some((arg, value)))
    }
}

fn parse<I>(args: I) -> Result<Command, CliError>
where
    I: IntoIterator<Item = OsString>,
{
    let mut strings = Vec::new();
    for (i, arg) in args.into_iter().enumerate() {
        let arg = arg
            .into_string()
            .map_err(|_| CliError::new(format!("argument {}", i + 1), "not valid UTF-8"))?;
        strings.push(arg);
    }
    let mut rest = strings.into_iter();
    let Some(command) = rest.next() else {
        return Ok(Command::Help);
    };
    let mut args = Args { rest, position: 2 };
    match command.as_str() {
        "help" | "--help" | "-h" => Ok(Command::Help),
        "--version" | "-V" | "version" => Ok(Command::Version),
        "proxy" => parse_proxy(&mut args),
        "serve" => {
            let mut listen = default_addr(4010);
            let mut stdin_stops = false;
            while let Some((flag, value)) = args.next_flag(&|f| f != STDIN_STOPS)? {
                match flag.as_str() {
                    "--listen" => listen = parse_addr(&flag, &value)?,
                    STDIN_STOPS => stdin_stops = true,
                    _ => return Err(unknown(&flag, "serve")),
                }
            }
            Ok(Command::Serve {
                listen,
                stdin_stops,
            })
        }
        "demo" => match args.next_flag(&|_| false)? {
            None => Ok(Command::Demo),
            Some((flag, _)) => Err(unknown(&flag, "demo")),
        },
        "keys" => parse_keys(&mut args),
        other => Err(CliError::new(
            other,
            "unknown subcommand (proxy, serve, demo, keys, help)",
        )),
    }
}

/// The flag that makes stdin's end stop `proxy` or `serve`.
const STDIN_STOPS: &str = "--stop-on-stdin-close";

fn default_addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn unknown(flag: &str, command: &str) -> CliError {
    CliError::new(flag, format!("not a flag of `{command}`"))
}

fn parse_addr(flag: &str, value: &str) -> Result<SocketAddr, CliError> {
    value.parse().map_err(|_| {
        CliError::new(
            flag,
            format!("{value:?} is not an IP address and port (127.0.0.1:8080)"),
        )
    })
}

fn parse_number(flag: &str, value: &str) -> Result<u64, CliError> {
    value
        .parse()
        .map_err(|_| CliError::new(flag, format!("{value:?} is not a whole number")))
}

fn parse_proxy(args: &mut Args) -> Result<Command, CliError> {
    let mut upstream = None;
    let mut listen = default_addr(8080);
    let mut faults = Fault::DEFAULT_MIX.to_vec();
    let mut identity = OpIdentity::new();
    let mut routes = RouteKinds::new();
    let mut slow = Duration::from_secs(30);
    let mut max_body = None;
    let mut json = false;
    let mut max_applied_twice = 0;
    let mut drain = Duration::from_secs(5);
    let mut replayed_header = None;
    let mut stdin_stops = false;
    while let Some((flag, value)) = args.next_flag(&|f| f != "--json" && f != STDIN_STOPS)? {
        match flag.as_str() {
            "--upstream" => upstream = Some(value),
            "--listen" => listen = parse_addr(&flag, &value)?,
            "--faults" => faults = Fault::parse_list(&value)?,
            "--op-header" => identity = identity.op_header(&value)?,
            "--key-header" => identity = identity.key_header_name(&value)?,
            "--replayed-header" => replayed_header = Some(value),
            "--op-id" => identity = identity.op_id_pointer(&value)?,
            "--write" => routes.add(&flag, &value, RouteKind::Write)?,
            "--read" => routes.add(&flag, &value, RouteKind::Read)?,
            "--slow-ms" => slow = Duration::from_millis(parse_number(&flag, &value)?),
            "--max-body" => max_body = Some(parse_number(&flag, &value)?),
            "--json" => json = true,
            STDIN_STOPS => stdin_stops = true,
            "--max-applied-twice" => max_applied_twice = parse_number(&flag, &value)?,
            "--drain-ms" => drain = Duration::from_millis(parse_number(&flag, &value)?),
            _ => return Err(unknown(&flag, "proxy")),
        }
    }
    let upstream = upstream.ok_or_else(|| CliError::new("--upstream", "required"))?;
    let mut config = ProxyConfig::new(&upstream)?
        .faults(faults)
        .identity(identity)
        .routes(routes)
        .slow(slow);
    if let Some(name) = replayed_header {
        config = config.replayed_header(&name)?;
    }
    if let Some(bytes) = max_body {
        let bytes = usize::try_from(bytes)
            .map_err(|_| CliError::new("--max-body", "too large for this machine"))?;
        config = config.max_body(bytes);
    }
    Ok(Command::Proxy {
        config: Box::new(config),
        listen,
        json,
        max_applied_twice,
        drain,
        stdin_stops,
    })
}

fn parse_keys(args: &mut Args) -> Result<Command, CliError> {
    let (mut target, mut route, mut concurrency, mut hold) = (None, None, None, None);
    let mut keep = None;
    let (mut headers, mut body) = (Vec::new(), None);
    while let Some((flag, value)) = args.next_flag(&|_| true)? {
        match flag.as_str() {
            "--target" => target = Some(value),
            "--route" => route = Some(value),
            "--header" => headers.push(value),
            "--body" => body = Some(value),
            "--concurrency" => concurrency = Some(parse_number(&flag, &value)?),
            "--hold-ms" => hold = Some(parse_number(&flag, &value)?),
            "--keep-ms" => keep = Some(parse_number(&flag, &value)?),
            _ => return Err(unknown(&flag, "keys")),
        }
    }
    let target = target.ok_or_else(|| CliError::new("--target", "required"))?;
    let route = route.ok_or_else(|| CliError::new("--route", "required"))?;
    let mut check = KeysCheck::new(&target, &route)?;
    for line in &headers {
        check = check.header(line)?;
    }
    if let Some(body) = body {
        check = check.body(&body);
    }
    if let Some(n) = concurrency {
        let n = usize::try_from(n)
            .ok()
            .filter(|n| (2..=1024).contains(n))
            .ok_or_else(|| CliError::new("--concurrency", "must be from 2 to 1024"))?;
        check = check.concurrency(n);
    }
    if let Some(ms) = hold {
        check = check.hold(Duration::from_millis(ms));
    }
    if let Some(ms) = keep {
        check = check.keep(Duration::from_millis(ms));
    }
    Ok(Command::Keys {
        check: Box::new(check),
    })
}

/// Waits for SIGINT (ctrl-c), on Unix SIGTERM, and with `stdin_stops` stdin's end.
async fn stopped(stdin_stops: bool) {
    if stdin_stops {
        tokio::select! {
            _ = signalled() => {}
            _ = stdin_closed() => {}
        }
    } else {
        signalled().await;
    }
}

/// Resolves when stdin reaches its end or fails to read. A thread, as tokio's stdin is a
/// feature the lab does not build with; whatever comes in is ignored.
async fn stdin_closed() {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        use std::io::Read as _;
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 256];
        while matches!(stdin.read(&mut buf), Ok(n) if n > 0) {}
        let _ = tx.send(());
    });
    let _ = rx.await;
}

/// Waits for SIGINT (ctrl-c) or, on Unix, SIGTERM.
async fn signalled() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// Runs a command; `Ok(false)` when its check failed.
async fn run(command: Command) -> Result<bool, CliError> {
    match command {
        Command::Help | Command::Version => Ok(true),
        Command::Proxy {
            config,
            listen,
            json,
            max_applied_twice,
            drain,
            stdin_stops,
        } => {
            let proxy = Proxy::start(*config, listen).await?;
            eprintln!(
                "retry-safety-lab: proxy listening on http://{}; SIGINT (ctrl-c) or SIGTERM prints the counts",
                proxy.addr()
            );
            stopped(stdin_stops).await;
            // Nothing new is forwarded from here; what is still at the upstream may yet be
            // answered as a stored response, and is waited for (counted as applied meanwhile).
            let report = proxy.drain(drain).await;
            if report.pending() > 0 {
                eprintln!(
                    "retry-safety-lab: {} requests were still at the upstream after --drain-ms; counted as applied",
                    report.pending()
                );
            }
            if json {
                println!("{}", report.to_json(max_applied_twice));
            } else {
                print!("{}", report.table(max_applied_twice));
            }
            Ok(report.passes(max_applied_twice))
        }
        Command::Serve {
            listen,
            stdin_stops,
        } => {
            let upstream = Upstream::start(listen).await?;
            eprintln!(
                "retry-safety-lab: upstream listening on http://{}; SIGINT (ctrl-c) or SIGTERM stops it",
                upstream.addr()
            );
            stopped(stdin_stops).await;
            eprintln!(
                "retry-safety-lab: the handler ran {} times",
                upstream.handler_runs()
            );
            Ok(true)
        }
        Command::Demo => {
            let rows = run_demo(OPS).await?;
            print!("{}", demo_table(&rows));
            Ok(demo_holds(&rows))
        }
        Command::Keys { check } => {
            let report = check.run().await;
            print!("{report}");
            Ok(report.passed())
        }
    }
}
