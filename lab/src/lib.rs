//! A fault lab for any client: prove, in CI, that an SDK in any language never applies a
//! write twice.
//!
//! The `retry-safety-lab` binary is its command line (`cargo install retry-safety-lab`, or
//! from the repository `cargo install --path lab`); this library is what it runs.
//!
//! A tower client stack through the lab's proxy and upstream, on loopback, with the default
//! mix of faults: 12 writes and 12 reads, and what the proxy counted.
//!
//! ```
//! use std::time::Duration;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use tower::ServiceBuilder;
//! use tower_retry_safety::RetryPolicy;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let client = Client::builder(TokioExecutor::new()).build_http();
//! let policy = RetryPolicy::builder()
//!     .attempt_timeout(Duration::from_secs(1))
//!     .build()?;
//! let stack = ServiceBuilder::new().layer(policy).service(client);
//! let report = retry_safety_lab::run_stack(stack, 12).await?;
//! assert_eq!(report.writes(), 12);
//! assert_eq!(report.applied_twice(), 0); // no write reached the upstream twice
//! println!("{}", report.table(0));
//! # Ok(()) }
//! # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
//! ```
//!
//! The same with `tower::retry` and the policy people typically write for it
//! ([`TypicalPolicy`]) applies some writes twice: `retry-safety-lab demo` prints both.
//!
//! # The commands
//!
//! - **`proxy --upstream URL`**: a reverse proxy ([`Proxy`]) the client under test is pointed
//!   at. Each operation's first attempt gets one [`Fault`] from a mix given out in turn per
//!   route (by default: none; response lost after the upstream applied the write; answer held
//!   after apply; 503 after apply; 429 before apply; 500 before apply; on request, a reset
//!   before forwarding, HTTP/2's `REFUSED_STREAM`, and an HTTP/2 `GOAWAY` before forwarding
//!   or after apply), and later attempts pass through.
//!   Attempts are linked into operations as a client repeats them ([`OpIdentity`], whose
//!   module docs hold the design): by `--op-header` (a value the harness sets per call) when
//!   present, else by `Idempotency-Key` (or `--key-header`), else by method, path and body
//!   (a multipart body without its boundary; `--op-id /json/pointer` for a value in the
//!   body); a resend with a new key is linked by its content to an operation not yet
//!   answered 2xx, and counted *uncertain*. Writes and reads are told apart by method and
//!   by `--write` / `--read` rules in the crate's route syntax ([`RouteKinds`]). On SIGINT or
//!   SIGTERM it stops forwarding, waits for requests still at the upstream (`--drain-ms`),
//!   prints a [`Report`] per route (`--json` for machines) and exits 1 when more writes than
//!   `--max-applied-twice` (default 0) may have been applied twice, when no write reached it
//!   (nothing was verified), or when a request was refused for a body over `--max-body`
//!   (never checked).
//! - **`serve`**: an [`Upstream`] for a quick try: any route answers a small JSON body,
//!   behind this crate's [`IdempotencyLayer`](tower_idempotency_keys::IdempotencyLayer) over the
//!   memory store.
//! - **`demo`**: upstream, proxy and clients in one process on loopback: `tower::retry` with a
//!   typical policy applies writes twice, this crate's layer none.
//! - **`keys --target URL --route 'POST /v1/payments'`**: a conformance check ([`KeysCheck`])
//!   for a server that honours `Idempotency-Key`: a malformed key gets 400, a key in flight
//!   409, a key reused with another payload 422, a repeat the first answer (status, body,
//!   `content-type`, `location`, `content-location`, `etag`), concurrent requests with one key
//!   run the handler once, a repeat after the handler failed does not run it again, a key
//!   differing only in case is another key, and the first key sent again after `--keep-ms`
//!   (3 s) still gets its first answer.
//!   `--header 'NAME: VALUE'` (credentials, never shown) and `--body` (the API's own payload,
//!   `{variant}` made different per request) let it run against a real API. The check
//!   passes only when no rule failed and the run-once rules (in flight, repeat, concurrent,
//!   after a failure) were each tried and kept: a skipped one verified nothing.
//!
//! # What the counts mean
//!
//! An attempt reached the upstream (and may have applied) from the moment the proxy hands it
//! to its upstream client, answered or not: a connection that breaks after the upstream read
//! the request, or an answer longer than `--max-body`, does not show the write was not run. Only a connect
//! error to the upstream proves an attempt was not sent. An answer, when one arrives whole,
//! can only take an attempt back: one marked `idempotent-replayed: true` (a stored response,
//! as this crate's server layer and Stripe mark them; `--replayed-header` names another), a
//! 400, 409 or 422 to a keyed request (`Idempotency-Key`, or `--key-header`), or a 429 (RFC
//! 6585: refused for its rate) ran nothing. A 503, even with `Retry-After`, counts as applied:
//! nothing says the handler did not run first. A write is *applied twice* when two or more of its attempts may have
//! applied. What the client got is the answer that completed last for the operation, except
//! that a 2xx, once given, stays (a hedged request's 2xx counts even if a later hedge was
//! begun, and an attempt the client abandoned does not take it back by ending later), and
//! that no answer does not replace one given; an answer held for the slow fault records
//! nothing unless the client waited it out. An answer is counted only if the client is
//! still there to take it: an HTTP/1.1 client that closed its connection (behind requests
//! it pipelined, which hide the close from hyper) is given nothing. When requests it
//! pipelined are still unread, a close behind them cannot be seen: a 2xx given then counts
//! as answered but *unconfirmed* (the lab cannot know that it arrived) until the proxy
//! finds the client still there on that connection.
//!
//! Failed operations are split three ways: the upstream answered one of their attempts
//! (`failed, answered`); an attempt was sent and none answered (`failed, no answer`); none
//! was sent (`failed, never sent`). On SIGINT or SIGTERM the proxy stops accepting and
//! forwarding, waits up to `--drain-ms` for attempts still at the upstream, and reports those
//! still there as `pending` (counted as applied).
//!
//! Two identical requests without a key or an op header are one operation to the proxy
//! (a second GET of the same path counts as a resend), and so are two with one body and
//! different keys while the first is unanswered (counted uncertain): give each logical
//! request its own `--op-header` value, or its own path or body, when a test repeats one on
//! purpose. A resend whose key and body both change (a nonce per attempt) cannot be linked
//! without `--op-header` or `--op-id`: it counts as a new operation.
//!
//! # For a server's keys to be checked
//!
//! `keys` asks the server for three things through headers, which a test deployment honours:
//! `x-lab-hold-ms: N` (the handler holds its answer N ms, so that repeats overlap it),
//! `x-lab-fail` (the handler fails after it may have applied its effect), and a response
//! header `x-lab-handler-run` unique per handler run. `serve` does all three. Without the
//! run header, answers that differ still fail a rule, but equal answers cannot tell a replay
//! from a second run: `repeat-same-answer` and `concurrent-run-once` are then `skip`
//! (unverified), not `pass`. The check first sends one well-formed keyed request: if the
//! route does not answer it 2xx, every rule is `skip`; with a `--body` without `{variant}`,
//! so is every rule when that payload sent again with a fresh key is not answered 2xx (an API
//! that refuses a payload it already applied would otherwise pass rules without keys).
//! `in-flight-409` fails when both requests got one handler run's 2xx after the hold was over
//! (the server held the repeat until the first ended instead of answering 409), and is
//! `skip` when one came sooner (the hold was not honoured: they may not have overlapped);
//! `repeat-after-failure` is `skip` when the failed request got neither a 5xx nor no
//! answer. A rule the server does not let the check try is reported `skip`: a skipped
//! run-once rule leaves the check unpassed (exit 1), a skipped `other-payload-422` (a
//! `--body` without `{variant}`) does not.
//!
//! # HTTP/2's GOAWAY
//!
//! `goaway-before-forwarding` and `goaway-after-apply` (not in the default mix) end an HTTP/2
//! client's connection as a server shutting down would: one `GOAWAY` (`NO_ERROR`) whose
//! last-stream-id is the highest stream the proxy forwarded on that connection (RFC 9113
//! §6.8), then a graceful close. Before forwarding, that id is below the faulted stream
//! unless a higher one was already forwarded; after apply, it covers the faulted stream,
//! whose answer is never sent. Nothing is forwarded after the GOAWAY: a stream above its id,
//! or one it covers that was not yet forwarded, is refused (`REFUSED_STREAM`: not processed)
//! and counted as never sent; one whose request had not arrived whole is not counted (it
//! cannot be told apart). A counted refusal uses up its operation's first attempt, and its
//! fault. Streams already forwarded get their answers if the upstream gives them within the
//! slow delay and 2 s after the GOAWAY, before the connection closes (a later one is cut off:
//! its client sees a failure after a request that may have applied; the ledger, which counts
//! an answer once it is handed over, may already count it answered). HTTP/1.1 has no GOAWAY: there the two close the connection, as
//! `reset-before-forwarding` and `drop-after-apply` do.
//!
//! This crate's classifier takes a remote GOAWAY as ambiguous (hyper can report one for a
//! request it already wrote), so its layer resends neither fault's writes, only reads.
//!
//! # In an SDK's CI
//!
//! ```text
//! cargo install retry-safety-lab
//! retry-safety-lab serve --listen 127.0.0.1:4010 &          # or your API's stand-in
//! retry-safety-lab proxy --upstream http://127.0.0.1:4010 --listen 127.0.0.1:8080 \
//!     --write 'POST /v1/{*rest}' --op-header x-stainless-retry-id > lab.txt &
//! LAB=$!
//! API_BASE_URL=http://127.0.0.1:8080 TIMEOUT_SECONDS=2 pytest tests/retries   # your SDK's tests
//! kill -INT $LAB; wait $LAB      # exit status 1 if any write reached the upstream twice
//! ```
//!
//! Set the SDK's timeout well below the proxy's `--slow-ms` (30 s by default).
//!
//! # Limits
//!
//! The proxy speaks HTTP/1.1 and HTTP/2 to clients and HTTP/1.1 to the upstream. Bodies are
//! read whole, up to `--max-body` (1 MiB; a longer
//! request gets 413 and is not counted; a longer answer gets the client a 502, the attempt
//! counted as sent with no answer). It keeps one entry per operation until it stops.

mod cli;
mod demo;
mod error;
mod fault;
mod frame_filter;
mod goaway;
mod h2_serve;
mod keys;
mod ledger;
mod listen;
mod multipart;
mod op_id;
mod preface;
mod proxy;
mod report;
mod routes;
mod serve;
mod unanswered;

pub use cli::{main_with_args, USAGE};
pub use demo::{
    demo_holds, demo_routes, demo_table, run_demo, run_stack, run_stack_with, DemoRow,
    TypicalPolicy,
};
pub use error::LabError;
pub use fault::Fault;
pub use keys::{KeysCheck, KeysReport, Outcome, RuleResult};
pub use op_id::{OpId, OpIdentity, Signals};
pub use proxy::{Proxy, ProxyConfig};
pub use report::{passes, Report, RouteCounts};
pub use routes::{Kind, RouteKinds};
pub use serve::{Upstream, FAIL_HEADER, HOLD_HEADER, RUN_HEADER};
