//! Honours `Idempotency-Key` on a tower server (hyper, axum, tonic): a keyed write runs once,
//! and every repeat of its key gets the first one's stored response, so a client may retry
//! a write safely.
//!
//! ```
//! use std::convert::Infallible;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use bytes::Bytes;
//! use http_body_util::{Either, Full};
//! use tower::{service_fn, ServiceBuilder, ServiceExt};
//! use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let sent = Arc::new(AtomicUsize::new(0));
//! let counter = sent.clone();
//! let svc = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::new(MemoryStore::new()))
//!     .service(service_fn(move |_req: http::Request<Either<Full<Bytes>, Full<Bytes>>>| {
//!         counter.fetch_add(1, Ordering::SeqCst); // the side effect
//!         async { Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from("sent")))) }
//!     }));
//! let send = || {
//!     http::Request::post("/v1/messages")
//!         .header("idempotency-key", "\"k-1\"")
//!         .body(Full::new(Bytes::from("hi")))
//! };
//! let first = svc.clone().oneshot(send()?).await?;
//! let again = svc.oneshot(send()?).await?;
//! assert!(first.headers().get("idempotent-replayed").is_none());
//! assert_eq!(again.headers()["idempotent-replayed"], "true");
//! assert_eq!(sent.load(Ordering::SeqCst), 1);
//! # Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo()).unwrap();
//! ```
//!
//! # Map
//!
//! - **The root**: what a first stack names. [`IdempotencyLayer`] and its
//!   [`IdempotencyService`]; the store trait [`IdempotencyStore`] and what a store of your own
//!   deals in ([`Begin`], [`Entry`], [`FencingToken`], [`Fingerprint`], [`StoredResponse`],
//!   [`StoreError`]); the request's key, [`RequestKey`], and the keys it derives for the
//!   handler's own calls, [`DerivedKey`]; with `postgres`, the request's transaction in atomic
//!   mode, `KeyTransaction`; with `axum`, the extractors' rejection `NotKeyed`, and
//!   `AxumIdempotencyLayer` / `AxumIdempotencyService` (the layer answering with axum's body).
//! - [`stores`]: [`MemoryStore`](stores::MemoryStore), `RedisStore` and `RedisStoreBuilder`
//!   (feature `redis`), `PostgresStore` (feature `postgres`), and in `stores::postgres` the
//!   rest of PostgreSQL's atomic mode (`AtomicLayer`, `AtomicService`, `KeyTransactionGuard`,
//!   `TransactionError`, the table's `SCHEMA`).
//! - [`future`]: the layer's response future and response body, and axum's future.
//! - [`deadline`]: [`DeadlineLayer`](deadline::DeadlineLayer), the caller's deadline read from
//!   every convention clients send; its future and body in [`deadline::future`].
//!
//! # The rules
//!
//! For a request with a key (in the `Idempotency-Key` header, [or
//! another](IdempotencyLayer::key_header)):
//!
//! - **the first one runs**: its response (any status) is buffered up to a limit, stored with
//!   a [TTL](IdempotencyLayer::ttl) and returned;
//! - **a repeat after it completed gets the stored response**, byte for byte, with an
//!   `idempotent-replayed: true` header;
//! - **a repeat while the first is in flight gets 409** with `Retry-After`;
//! - **the same key with a different request gets 422**: requests are compared by a SHA-256
//!   [`Fingerprint`] of the method, the path with its query, and the body;
//! - **a bad key gets 400** and never reaches the store. Keys are what common clients send: a
//!   Structured Field string (`"8e03978e-…"`, the IETF draft's form) or a bare token of
//!   visible ASCII without quotes or backslashes (`8e03978e-…`, Stripe's form); non-empty, at
//!   most 255 bytes. Both spell the same key: `"k-1"` and `k-1` are one key. A request
//!   without a key whose method [requires one](IdempotencyLayer::require_key_for) is a bad key
//!   too;
//! - **a store that fails (or refuses the claim) gets 503** with `Retry-After`, and nothing
//!   runs: the layer never runs a keyed request without the store's guarantee;
//! - **the [deadline layer](deadline::DeadlineLayer) goes outermost**, above every layer that
//!   can make a request wait: a request whose caller has gone starts nothing, and its key is
//!   freed (the [`deadline`] module says why outermost).
//!
//! Requests without a key pass through untouched.
//!
//! # A key is freed only if its handler did not run
//!
//! A key is claimed before the handler is called; a request refused before that (a bad key, a
//! body over [the limit](IdempotencyLayer::max_request_bytes) (413) or unreadable, a store that
//! failed) claims nothing and runs nothing. Once the handler has been called, the key is never
//! freed, whatever happens:
//!
//! - **The client goes away** (its timeout, a disconnect; hyper then drops the request): the
//!   rest of the call is detached onto the tokio runtime and runs until the handler answers;
//!   its response is stored for the repeats, and the key is in flight meanwhile.
//! - **The handler fails** (the inner service returns an error — a server-side timeout, a
//!   lost backend — or panics): it may have applied its effect before failing, so the outcome
//!   is *unknown*, and a stand-in entry says so: **500**, `x-should-retry: false` and a text
//!   body. Every repeat gets it; the error itself reaches hyper as before. (Keeping the key in
//!   flight instead would answer 409 until the lease ends and then run the handler again.)
//! - **The response cannot be stored whole** (over
//!   [`max_response_bytes`](IdempotencyLayer::max_response_bytes), or its body fails while
//!   being read): the first client gets the whole response, streamed; repeats get
//!   its status and headers with an empty body and `idempotent-replay-body: omitted`.
//! - **The store refuses the entry** (full, or failing): the key is held in flight (its lease
//!   renewed) while the entry is tried again in the background, until it is stored or the
//!   key's TTL has passed.
//!
//! The inner service and its future must be `Send + 'static` (a call may be detached). Outside
//! a tokio runtime nothing can be detached: a dropped call ends there, its key in flight.
//!
//! # Leases and fencing
//!
//! A claim is a [lease](IdempotencyLayer::lease) (60 s by default) with a fencing token
//! ([`FencingToken`]): the layer renews it while the handler runs, so a handler may outlast it, and a
//! server that dies mid-handler holds its keys only until the lease ends.
//!
//! **Renewal guarantee.** While a handler runs, its claim is renewed every quarter of the
//! lease (at most a third apart; a renewal that fails is sent again every 1/48 of the lease
//! until the next is due) by a task of the layer's own on the handler's runtime, on its
//! own timer, and also from the task of any of the layer's handlers on that runtime, each time
//! one is polled or claims a key after the claim has gone a quarter lease unrenewed. On a
//! multi-thread runtime a handler keeps its claim, even one that never yields, while another
//! worker is free. On a current-thread runtime one thread runs everything, and it reads its
//! timers and sockets only when no task is ready to run, or else once every `event_interval`
//! task polls (61 by default); a task that yields (`tokio::task::yield_now`) is run again only
//! after that read.
//! So the claim is kept as long as the thread **reads its timers or comes back to one of the
//! layer's handlers** at least once per half lease of clock time with [`MemoryStore`](stores::MemoryStore), and
//! once per quarter lease with `RedisStore` (a renewal there also takes a turn of redis-rs's
//! connection task). That time is a handler's own work between two `.await`s **plus that of
//! every other task busy on the thread meanwhile**: three handlers at once, each working 0.4
//! lease between awaits, come back to each one only every 1.2 leases, but each renews the
//! others' claims, which are kept; two tasks that wake each other directly (a channel, a
//! `Notify`), 8 ms of work a turn, keep the queue from emptying and push the timer read to
//! every 61 polls, about 490 ms, and a claim of a 400 ms lease whose handler waits on I/O
//! lapses (`tests/lease_renewal/stretches.rs` and `tests/lease_renewal/busy_runtimes.rs` keep these cases;
//! `event_interval(4)` holds the last). Outside a tokio runtime nothing is renewed. Serve keyed
//! handlers from a multi-thread runtime, or build a current-thread one with a low
//! `event_interval`; the layer logs a warning that says so, once per runtime, when it first
//! claims a key on a current-thread one.
//!
//! The lease bounds the windows in which "never twice" cannot hold, and they are these:
//!
//! - a server died mid-handler (or before its outcome was stored) and its lease ended: a
//!   repeat runs the handler again;
//! - the store was unreachable while a handler ran or while its outcome was being stored, until
//!   after the lease that the last renewal before the outage set had ended: the claim lapses,
//!   and another request may take the key. Failed renewals are sent again every 1/48 of the
//!   lease, so any outage shorter than two thirds of the lease is survived wherever it falls
//!   (renewals are at most a third of a lease apart), one of nearly a whole lease if it begins
//!   just after a renewal, and none longer than the lease;
//! - the store lost the key: with Redis, a failover to a replica that had not received it (or
//!   that `RedisStore` did not wait for), a restart without persistence, or an eviction (run it
//!   with `maxmemory-policy noeviction`: every entry has an expiry, so the `volatile-*` policies
//!   evict them too).
//!
//! ## What each topology guarantees
//!
//! What a crash or a failover can do to a key whose handler ran (the lease's own window, a
//! server dead mid-handler, comes on top in lease mode):
//!
//! | store and topology | a store crash (restart) | a failover |
//! |---|---|---|
//! | one Redis, no persistence | every key lost: repeats run again | — |
//! | one Redis, AOF `appendfsync everysec` | up to a second of claims and entries lost | — |
//! | one Redis, AOF `appendfsync always` | nothing acknowledged is lost | — |
//! | Redis primary + replicas, not waiting (`wait_for_replicas(0)`) | as the primary's persistence | a write the promoted replica lacked is lost: the key runs again |
//! | primary + replicas, waiting for *n* (`RedisStore`'s default: 1 when the primary has a replica) | as the primary's persistence | nothing acknowledged is lost if the promoted replica is one that confirmed (Sentinel and managed services promote the most up-to-date; wait for every replica to cover any choice), renewals excepted (they are not confirmed: see *A replica that receives nothing* below); while fewer than *n* replicas are connected, new keys get 503 at once and run nothing, and keys in flight keep their claims (renewals wait for no replica) and have their outcomes stored on the primary, sent again until replicas confirm them |
//! | the same through Sentinel (`RedisStore::sentinel`), or an address that follows the promotion | as above | as above, and a claim's owner renews and stores its outcome on the new primary, also when the new one has no replica yet, and when the old one is cut off from Sentinel but not from the owner (a primary found short of replicas is resolved again); on an address held to the old node, its outcome is lost and the key runs again once its lease ends |
//! | a replica that stays connected but receives nothing (its replication stream held: a stuck link, loss one way) for longer than the lease, then promoted | — | renewals are written on the primary alone, so a key whose handler outlasts the lease can run again: see below (`tests/stores/redis_failover/stream_held_past_the_lease.rs`: a 2 s lease, 2 runs; a 60 s one, 1 run) |
//! | a partitioned old primary still taking writes (split brain) | — | waiting, it cannot confirm (its replicas follow the new primary): 503, nothing run; not waiting, its writes are discarded when it rejoins |
//! | Redis Cluster (`RedisStore::cluster`), waiting for *n* replicas of the key's primary (default: 1 when every primary has one) | as each primary's persistence | per shard, as a primary with replicas waited for: the cluster promotes a replica of the failed primary and the client follows (`MOVED`); not waiting, a write the promoted replica lacked is lost |
//! | PostgreSQL, lease mode | nothing committed is lost (`synchronous_commit` on) | asynchronous standby: the last commits can be lost, like a replica not waited for; synchronous standby: nothing committed is lost |
//! | PostgreSQL, atomic mode | a crash before commit rolls back the key and the handler's writes together: nothing runs twice, no lease window | asynchronous standby: a lost commit loses the key *and* the effects in the same transaction (consistent, but an effect outside the database — an email — can repeat); synchronous standby: nothing committed is lost |
//!
//! **A replica that receives nothing.** A claim is confirmed by the replicas (`WAIT`) with the
//! expiry it had then; its renewals are not (see `RedisStore`). A replica whose replication
//! stream is held while it stays connected keeps the last expiry it received: once that has
//! passed, it reads the key as free. If it is promoted then, before the owner has stored the
//! outcome on it, a repeat of a key whose handler is still running (or whose outcome the old
//! primary alone had) runs the handler again. It takes a handler (plus storing its outcome on
//! the new primary) longer than the lease *and* a replica that received nothing for longer than
//! the lease before the primary failed *and* that replica chosen. What narrows it:
//!
//! - **a lease longer than the longest handler plus a failover**: the confirmed claim outlives
//!   both, the owner stores its outcome on the new primary, and repeats wait for it (409) and
//!   get it. A server that dies mid-handler then holds its keys for that lease.
//! - `repl-timeout` on the replicas below the lease: a replica that receives nothing (not even
//!   the primary's pings, every `repl-ping-replica-period`) drops its link within it (measured
//!   with 2 s: dropped within 3 s, and the primary counted it gone). The primary then has fewer
//!   replicas (new keys get 503, as above), and Sentinel does not promote a replica disconnected
//!   for longer than ten times `down-after-milliseconds` plus the time the primary has been down
//!   (Sentinel's documented rule): this narrows the window, it does not close it.
//! - `min-replicas-to-write` / `min-replicas-max-lag` do **not**: the lag they measure is the
//!   time since the replica's last acknowledgement, which it sends every second while it
//!   receives nothing (measured: lag 0–1 s for as long as the stream was held, writes taken;
//!   the test runs its primary with `min-replicas-max-lag 2`). Only when acknowledgements stop
//!   too does the primary refuse writes, renewals included, which saves no claim either.
//!
//! `WAIT` makes a write reach the replicas' memory, not their disks: a failover together with
//! a crash of the confirming replica can still lose it (Redis 7.2's `WAITAOF` covers disks; this
//! store does not send it).
//!
//! Set the lease longer than clients keep retrying, and check the resource's state when a key
//! stays in flight.
//!
//! # Whose key
//!
//! Keys live in one space unless [scoped](IdempotencyLayer::scope_keys_by) by sender (an
//! authenticated tenant, an API key id): scope them whenever several clients share a server,
//! so that no client is ever sent another's response for presenting its key.
//!
//! # What is stored
//!
//! Responses of every status are stored, errors included: a 500 may come after the write was
//! partly applied, and a client that repeats the key must learn the same outcome rather than
//! run the write a second time ([`store_server_errors(false)`](IdempotencyLayer::store_server_errors)
//! frees the key on a 5xx instead, for handlers whose 5xx proves nothing was applied).
//! A gRPC call (a POST with a gRPC content type, with or without the `tonic` feature) gets
//! the layer's own answers as gRPC statuses: a key in flight is `ABORTED` with
//! `grpc-retry-pushback-ms`, a key reused with another call or malformed `INVALID_ARGUMENT`,
//! nothing applied `UNAVAILABLE`, an unknown outcome `UNKNOWN`.
//! Requests without a key pass through untouched, unless their method
//! [requires one](IdempotencyLayer::require_key_for).
//!
//! # Stores
//!
//! [`MemoryStore`](stores::MemoryStore) is embedded and bounded, for one process.
//! [`IdempotencyStore`] is implementable over any store with an atomic insert-if-absent with
//! expiry and a compare-and-set.
//!
//! ## Fleets: keys shared through Redis
//!
//! A retry that lands on another instance behind a load balancer, or on a restarted one, must
//! find the key where the first attempt left it. With the `redis` feature, every instance puts
//! its `IdempotencyLayer` over a `RedisStore` on the same Redis (or Valkey, 7.0 or later): one
//! Redis, a primary with replicas it waits for, through Sentinel, or a Redis Cluster.
//!
//! ```no_run
//! # #[cfg(feature = "redis")]
//! # async fn demo() -> Result<(), tower_idempotency_keys::StoreError> {
//! use tower_idempotency_keys::{stores::RedisStore, IdempotencyLayer};
//!
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?.prefix("myapp:idem:");
//! let layer = IdempotencyLayer::new(store); // .lease(..), .ttl(..), .scope_keys_by(..)
//! # drop(layer);
//! # Ok(()) }
//! ```
//!
//! After an outage the layer serves again on its own once Redis is back. `cargo run --example
//! fleet` in the repository runs two instances on one Redis behind a forwarder that sends each
//! write's consecutive attempts to different instances, with the tour's faults (and a handler
//! slower than the client's timeout and the lease), and prints the counts:
//! `60 writes across the fleet: 60 succeeded, 60 applied in all, 0 applied twice`.
//!
//! ## Exactly once past a crash: PostgreSQL, atomic mode
//!
//! A lease cannot close its window: a server that dies after its handler wrote to the
//! database leaves a write that a repeat, once the lease has ended, applies again. With the
//! `postgres` feature (sqlx), `PostgresStore` works in lease mode (`IdempotencyLayer::new(store)`:
//! Redis's protocol and guarantees, for handlers whose effects are elsewhere) and in **atomic
//! mode**, where the key's entry commits **in the handler's own transaction** (Stripe's design,
//! Brandur Leach's `rocket-rides-atomic`):
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn demo() -> Result<(), tower_idempotency_keys::StoreError> {
//! use tower_idempotency_keys::{stores::PostgresStore, IdempotencyLayer};
//!
//! let store = PostgresStore::connect("postgres://app@127.0.0.1:5432/app").await?;
//! store.migrate().await?; // or apply `stores::postgres::SCHEMA` with your migration tool
//! let layer = IdempotencyLayer::new(store).atomic();
//! // The handler finds a `KeyTransaction` in the request's extensions and writes there; the layer
//! // writes the response into the key's row in the same transaction and commits once.
//! # drop(layer);
//! # Ok(()) }
//! ```
//!
//! What atomic mode closes, and what remains:
//!
//! - **Closed**: a server that dies (crash, `SIGKILL`, lost connection) or a handler that fails
//!   or panics before the commit leaves nothing: no order row, no key. The repeat runs on a
//!   clean slate. One that dies after the commit leaves both: the repeat gets the stored
//!   response. No lease guesses at a dead server: the key is in flight exactly while its
//!   transaction runs (an advisory transaction lock that ends with the transaction or the
//!   session). After a database that failed mid-request, the same key may be sent again
//!   whatever happened.
//! - **Open**: effects outside the transaction. An email sent or a card charged before a crash
//!   is not rolled back, and the re-run sends it again — unless the handler sends the provider
//!   the key derived from the request's (next section) and the provider honours keys: then the
//!   provider answers with its stored response. Client → server (atomic) → provider is then
//!   exactly once at every hop: `cargo run --example chain` runs the three on loopback with a
//!   lost response at each hop; `tests/postgres/crash.rs` kills a real server process at each
//!   point (after the write, after the provider's charge, after the commit) and counts one
//!   order and one charge each time.
//!
//! Both modes can share one table: a lease-mode claim takes the key's advisory lock for its
//! statement, so a key that an atomic transaction holds is in flight for it too. Every
//! statement names the table by its schema (the pool's `current_schema()`, or
//! `PostgresStore::schema`), so a handler that sets `search_path` cannot hide an entry. A
//! handler that commits by hand gets a 500 and its key keeps an unknown outcome (the claim's
//! in-flight row commits with its `COMMIT`, so no repeat runs meanwhile); a second
//! `KeyTransaction::acquire` while a guard is held fails at once.
//!
//! # The handler's own outbound calls
//!
//! Every keyed request reaches its handler with a [`RequestKey`] in its extensions. A handler
//! that calls a provider puts [`RequestKey::derive`]`("label")` on the outbound request's
//! `Idempotency-Key` (sent through `tower-retry-safety`'s client layer, with keys trusted
//! for the provider's host): a re-run of the handler — after a crash, or after its lease ended — sends
//! the same key, and a provider that honours keys answers with its stored response instead of
//! applying twice.
//!
//! **Retrying by hand after an ambiguous error** (on the client): read `err.idempotency_key()`;
//! check the provider's state or your execution log; if the write did not happen, or you
//! cannot tell and the server honours keys, send it again *with that same key* — the server
//! then runs it at most once. Never mint a new key for a retry of the same logical write.
//!
//! # With axum
//!
//! `Router::layer` takes the layer as it is (it wraps each route). To wrap a whole `Router`
//! for `axum::serve`, which takes only services that answer with axum's body type, use
//! [`for_axum`](IdempotencyLayer::for_axum) (feature `axum`, axum 0.8):
//!
//! ```
//! # #[cfg(feature = "axum")]
//! # async fn demo() -> std::io::Result<()> {
//! use axum::{routing::post, Router};
//! use tower::Layer;
//! use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};
//!
//! let router = Router::new().route("/v1/messages", post(|| async { "sent" }));
//! let app = IdempotencyLayer::new(MemoryStore::new()).for_axum().layer(router);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! # let serving =
//! axum::serve(listener, tower::make::Shared::new(app));
//! # drop(serving);
//! # Ok(()) }
//! ```
//!
//! `e2e/examples/axum.rs` in the repository runs one, with a client that retries its writes
//! through it (`cargo run --example axum`).
//!
//! # Metrics
//!
//! With the `opentelemetry` feature, hand a `Meter` to [`IdempotencyLayer::meter`](IdempotencyLayer::meter); the instruments are made once, there. The attributes follow the client's conventions (`tower_retry_safety::metrics`).
//!
//! | instrument | kind | unit | attributes | what it counts |
//! |---|---|---|---|---|
//! | `retry_safety.server.keyed_requests` | counter | `{request}` | method, `retry_safety.key.outcome` | requests with a key (or without one where [`require_key_for`](IdempotencyLayer::require_key_for) asks for it), by how the layer answered |
//! | `retry_safety.server.lease.renewals` | counter | `{renewal}` | `retry_safety.renewal.result` | renewals of a claim's lease while its handler runs |
//! | `retry_safety.server.atomic.transactions` | counter | `{transaction}` | `retry_safety.transaction.result` | atomic mode (`AtomicLayer`, feature `postgres`): each keyed transaction, by how it ended |
//!
//! `retry_safety.key.outcome` is one of:
//!
//! | value | answer |
//! |---|---|
//! | `claimed` | the key was claimed; the handler runs |
//! | `stored-response` | a repeat, answered from the stored response |
//! | `in-flight` | a repeat while the first still runs: 409 |
//! | `mismatch` | the key was used with a different request: 422 |
//! | `malformed-key` | the key is not a well-formed key: 400 |
//! | `missing-key` | the method needs a key and the request has none: 400 |
//! | `rejected` | refused before a claim: a body over the limit (413), unreadable or without its scope (400) |
//! | `store-error` | the store failed or refused the claim: 503, nothing ran |
//! | `unavailable` | claimed, then refused before the handler ran (no timer in the runtime): 503 |
//!
//! `retry_safety.renewal.result` is `renewed`, `fenced` (refused: another claim holds the key
//! now) or `failed` (the store failed, or did not answer within the renewal interval).
//!
//! `retry_safety.transaction.result` is `committed` (the handler's writes and the key's entry
//! together), `commit-unconfirmed` (the commit was not acknowledged: 503), `rolled-back` (the
//! handler failed, answered a 5xx not to be stored, or a statement failed) or `unknown` (the
//! handler ended or kept the transaction itself: the key keeps an unknown outcome). Atomic mode
//! counts its keyed answers in `retry_safety.server.keyed_requests` as lease mode does (its
//! layer takes the meter from the `IdempotencyLayer` it was made from); it has no leases to renew.
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod answers;
#[cfg(feature = "axum")]
mod axum;
mod body;
mod buffer;
mod claim;
pub mod deadline;
mod derive;
mod detach;
#[cfg(any(feature = "redis", feature = "postgres"))]
mod encoding;
#[cfg(feature = "axum")]
mod extract;
pub mod future;
mod grpc;
mod layer;
mod memory;
mod mode;
mod observe;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
mod renewal;
mod run;
mod service;
mod store;
pub mod stores;
mod text;

#[cfg(feature = "axum")]
pub use crate::axum::{AxumIdempotencyLayer, AxumIdempotencyService};
pub use crate::derive::{DerivedKey, RequestKey};
#[cfg(feature = "axum")]
pub use crate::extract::NotKeyed;
pub use crate::layer::IdempotencyLayer;
#[cfg(feature = "postgres")]
pub use crate::postgres::atomic::KeyTransaction;
pub use crate::service::IdempotencyService;
pub use crate::store::{
    Begin, Entry, FencingToken, Fingerprint, IdempotencyStore, StoreError, StoredResponse,
};

/// The README's examples, compiled.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
