//! The proxy's books: per operation, its attempts, the requests handed to the upstream (each
//! may have applied until an answer says it did not), and the last answer the client was
//! given; per route, whose turn in the fault mix. Attempts are linked into operations by
//! their [`OpSignals`] as the [`op_id`](super::op_id) module's docs say.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use crate::fault::Fault;
use crate::op_id::{OpId, OpSignals};
use crate::report::{ProxyReport, RouteCounts};
use crate::routes::RouteKind;

/// What the client was last given for an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Nothing yet: the attempt is still in the proxy, or its client gave up on a held
    /// answer (which then never completes).
    Pending,
    /// A response with this status.
    Status(u16),
    /// A response with this status, given on an HTTP/1.1 connection whose client had sent
    /// bytes not yet read (requests it pipelined): a close behind them cannot be seen, so it
    /// may never have arrived. [`Ledger::confirm`] makes it a `Status` once a later look at
    /// that connection finds the client there.
    Unconfirmed(u16),
    /// No response: a fault closed the connection or reset the stream, or its client had
    /// gone.
    Lost,
}

impl Answer {
    fn is_2xx(self) -> bool {
        matches!(self, Answer::Status(s) | Answer::Unconfirmed(s) if (200..300).contains(&s))
    }

    /// How much of an answer the client holds: a 2xx, over a 2xx it may hold, over another
    /// response, over none. A later answer replaces one of no higher rank.
    fn rank(self) -> u8 {
        match self {
            Answer::Pending | Answer::Lost => 0,
            _ if !self.is_2xx() => 1,
            Answer::Unconfirmed(_) => 2,
            Answer::Status(_) => 3,
        }
    }
}

/// How an attempt handed to the upstream ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sent {
    /// Provably not sent: the upstream client could not connect.
    ConnectFailed,
    /// Sent, and no whole answer came back (the connection broke, or the answer was longer
    /// than the proxy reads): the upstream may have applied it.
    NoAnswer,
    /// The upstream answered; `applied` unless the answer says it ran nothing.
    Answered { applied: bool },
}

#[derive(Debug)]
struct OpState {
    route: usize,
    attempts: u64,
    /// Attempts handed to the upstream (less those that provably never left).
    sent: u64,
    /// Attempts the upstream answered whole.
    upstream_answers: u64,
    /// Attempts that may have applied: sent, less those whose answer says nothing ran.
    applied: u64,
    /// Attempts handed to the upstream that have not ended yet.
    in_flight: u64,
    answer: Answer,
    /// Named by the harness's op header: linked by it alone.
    named: bool,
    /// Its first attempt carried a key.
    keyed: bool,
    /// An attempt was linked to it by content alone, its key differing (or one had none).
    uncertain: bool,
}

impl OpState {
    /// Whether a resend may still come: its client has not been given a 2xx (one it may not
    /// have received leaves it open).
    fn open(&self) -> bool {
        !matches!(self.answer, Answer::Status(s) if (200..300).contains(&s))
    }
}

#[derive(Debug)]
struct RouteState {
    label: String,
    kind: RouteKind,
    /// Operations seen on this route: the next one gets `faults[turn % faults.len()]`.
    turn: usize,
}

#[derive(Debug, Default)]
struct Books {
    /// Set by [`Ledger::close`]: no attempt is begun or handed to the upstream after it.
    closed: bool,
    /// Indexed by operation number.
    ops: Vec<OpState>,
    by_op_header: HashMap<OpId, usize>,
    by_key: HashMap<OpId, usize>,
    /// Operations by content, oldest first.
    by_content: HashMap<OpId, Vec<usize>>,
    routes: Vec<RouteState>,
    route_of: HashMap<String, usize>,
    /// Requests refused with a 413 (over `--max-body`): never seen whole, so never checked.
    refused_over_limit: u64,
}

impl Books {
    /// The operation an attempt belongs to, if one was seen, and whether it was linked by
    /// content alone across different keys.
    fn find(&self, signals: &OpSignals) -> Option<(usize, bool)> {
        if let Some(op) = signals.op_header() {
            // The harness named the call: nothing else links it.
            return self.by_op_header.get(op).map(|&i| (i, false));
        }
        if let Some(&i) = signals.key().and_then(|k| self.by_key.get(k)) {
            return Some((i, false));
        }
        let keyed = signals.key().is_some();
        self.by_content
            .get(signals.content())?
            .iter()
            .rev()
            .map(|&i| (i, &self.ops[i]))
            .find_map(|(i, op)| match (keyed, op.keyed) {
                _ if op.named => None,
                // No key either time: the same request sent again, as before.
                (false, false) => Some((i, false)),
                // A key changed (or came or went): a resend only while the first may still be
                // answered by one, and then not certain.
                _ if op.open() => Some((i, true)),
                _ => None,
            })
    }

    /// Indexes the attempt's op header, key and content under operation `i`.
    fn index(&mut self, i: usize, signals: &OpSignals) {
        if let Some(op) = signals.op_header() {
            self.by_op_header.entry(op.clone()).or_insert(i);
        }
        if let Some(key) = signals.key() {
            self.by_key.entry(key.clone()).or_insert(i);
        }
        let ops = self
            .by_content
            .entry(signals.content().clone())
            .or_default();
        if ops.last() != Some(&i) {
            ops.push(i);
        }
    }

    /// The route's row, made on first sight.
    fn route(&mut self, kind: RouteKind, route: String) -> usize {
        if let Some(&index) = self.route_of.get(&route) {
            return index;
        }
        self.routes.push(RouteState {
            label: route.clone(),
            kind,
            turn: 0,
        });
        self.route_of.insert(route, self.routes.len() - 1);
        self.routes.len() - 1
    }
}

/// One attempt, as the ledger handed it out.
#[derive(Debug)]
pub(crate) struct Attempt {
    op: usize,
    /// The fault to inject: the mix's next on an operation's first attempt, else none.
    pub(crate) fault: Fault,
}

/// The operation of an attempt given an unconfirmed 2xx, kept to [`Ledger::confirm`] it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Unconfirmed(usize);

impl Attempt {
    pub(crate) fn unconfirmed(&self) -> Unconfirmed {
        Unconfirmed(self.op)
    }
}

/// Shared by every connection of a proxy; a short lock per event. Its `Debug` shows counts,
/// never operation ids (they may hold keys, header values, query strings).
pub(crate) struct Ledger {
    faults: Vec<Fault>,
    books: Mutex<Books>,
    /// Woken whenever an attempt at the upstream ends.
    ended: Notify,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let books = self.books();
        f.debug_struct("Ledger")
            .field("operations", &books.ops.len())
            .field("routes", &books.routes.len())
            .field("closed", &books.closed)
            .finish_non_exhaustive()
    }
}

impl Ledger {
    pub(crate) fn new(faults: Vec<Fault>) -> Self {
        Ledger {
            faults,
            books: Mutex::default(),
            ended: Notify::new(),
        }
    }

    fn books(&self) -> MutexGuard<'_, Books> {
        // A panic elsewhere leaves counts that are still counts.
        self.books.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts an attempt; an operation's first attempt takes the route's next fault.
    /// Operations take turns per route, so each route's share of every fault is exact
    /// whatever order routes interleave in.
    /// `None` once the ledger is closed: the attempt is neither counted nor forwarded.
    pub(crate) fn begin(
        &self,
        signals: &OpSignals,
        kind: RouteKind,
        route: String,
    ) -> Option<Attempt> {
        let mut books = self.books();
        let books = &mut *books;
        if books.closed {
            return None;
        }
        if let Some((op, uncertain)) = books.find(signals) {
            let state = &mut books.ops[op];
            state.attempts += 1;
            state.uncertain |= uncertain;
            books.index(op, signals);
            return Some(Attempt {
                op,
                fault: Fault::None,
            });
        }
        let index = books.route(kind, route);
        let turn = &mut books.routes[index].turn;
        let fault = self
            .faults
            .get(*turn % self.faults.len().max(1))
            .copied()
            .unwrap_or(Fault::None);
        *turn += 1;
        books.ops.push(OpState {
            route: index,
            attempts: 1,
            sent: 0,
            upstream_answers: 0,
            applied: 0,
            in_flight: 0,
            answer: Answer::Pending,
            named: signals.op_header().is_some(),
            keyed: signals.key().is_some(),
            uncertain: false,
        });
        let op = books.ops.len() - 1;
        books.index(op, signals);
        Some(Attempt { op, fault })
    }

    /// A request refused with a 413 (over `--max-body`): the run then does not pass, as the
    /// lab never saw it whole.
    pub(crate) fn refused_over_limit(&self) {
        let mut books = self.books();
        if !books.closed {
            books.refused_over_limit += 1;
        }
    }

    /// The attempt is about to be handed to the upstream: from now on it may have applied,
    /// and is counted so. `false` once the ledger is closed: the attempt must not be sent.
    pub(crate) fn sending(&self, attempt: &Attempt) -> bool {
        let mut books = self.books();
        if books.closed {
            return false;
        }
        if let Some(state) = books.ops.get_mut(attempt.op) {
            state.sent += 1;
            state.applied += 1;
            state.in_flight += 1;
        }
        true
    }

    /// How an attempt handed to the upstream ended. Only proof subtracts: a connect error
    /// (not sent), or an answer saying the upstream ran nothing.
    pub(crate) fn sent(&self, attempt: &Attempt, how: Sent) {
        if let Some(state) = self.books().ops.get_mut(attempt.op) {
            state.in_flight = state.in_flight.saturating_sub(1);
            match how {
                Sent::ConnectFailed => {
                    state.sent = state.sent.saturating_sub(1);
                    state.applied = state.applied.saturating_sub(1);
                }
                Sent::NoAnswer => {}
                Sent::Answered { applied } => {
                    state.upstream_answers += 1;
                    if !applied {
                        state.applied = state.applied.saturating_sub(1);
                    }
                }
            }
        }
        self.ended.notify_waiters();
    }

    /// No attempt is begun or handed to the upstream from now on.
    pub(crate) fn close(&self) {
        self.books().closed = true;
    }

    /// Attempts handed to the upstream that have not ended yet.
    fn in_flight(&self) -> u64 {
        self.books().ops.iter().map(|s| s.in_flight).sum()
    }

    /// Waits until no attempt is at the upstream, or `within` has passed.
    pub(crate) async fn settle(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            // Registered before the count is read: an attempt ending in between still wakes.
            ended.as_mut().enable();
            if self.in_flight() == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return;
            }
        }
    }

    /// What the client was given for the attempt, noted as answers complete: the latest
    /// is the operation's, unless it holds less than the client already had (see
    /// [`Answer::rank`]): a 2xx given stays, and nothing given (`Lost`) does not replace a
    /// response. A client that has its 2xx is not taken back by an attempt it abandoned
    /// ending later: a hedge, or on pipelined HTTP/1.1 an answer held on a connection it
    /// left, which hyper does not see close behind the requests it buffered, so the hold
    /// ends and notes the answer lost after the client had the resend's 2xx.
    pub(crate) fn answered(&self, attempt: &Attempt, answer: Answer) {
        if let Some(state) = self.books().ops.get_mut(attempt.op) {
            if answer.rank() >= state.answer.rank() {
                state.answer = answer;
            }
        }
    }

    /// Unconfirmed 2xx answers, given on a connection a later look found the client still
    /// on: they reached it (it had not closed), as any answer given.
    pub(crate) fn confirm(&self, given: impl IntoIterator<Item = Unconfirmed>) {
        let mut books = self.books();
        for Unconfirmed(op) in given {
            if let Some(state) = books.ops.get_mut(op) {
                if let Answer::Unconfirmed(status @ 200..=299) = state.answer {
                    state.answer = Answer::Status(status);
                }
            }
        }
    }

    /// The counts so far, one row per route in the order routes were first seen.
    pub(crate) fn report(&self) -> ProxyReport {
        let books = self.books();
        let mut rows: Vec<RouteCounts> = books
            .routes
            .iter()
            .map(|r| RouteCounts::new(r.label.clone(), r.kind))
            .collect();
        for state in &books.ops {
            let Some(row) = rows.get_mut(state.route) else {
                continue;
            };
            row.operations += 1;
            row.attempts += state.attempts;
            row.upstream_requests += state.sent;
            row.pending += state.in_flight;
            if row.kind == RouteKind::Write && state.applied >= 2 {
                row.applied_twice += 1;
            }
            if row.kind == RouteKind::Write && state.uncertain {
                row.uncertain += 1;
            }
            if matches!(state.answer, Answer::Unconfirmed(200..=299)) {
                row.answered_ok_unconfirmed += 1;
            }
            match state.answer {
                answer if answer.is_2xx() => row.answered_ok += 1,
                _ if state.upstream_answers > 0 => row.failed_after_upstream += 1,
                _ if state.sent > 0 => row.failed_sent_no_answer += 1,
                _ => row.failed_provably_unsent += 1,
            }
        }
        ProxyReport::new(rows, books.refused_over_limit)
    }
}
