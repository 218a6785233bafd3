//! The proxy's books: per operation, its attempts, the requests that reached the upstream and
//! applied, and the last answer the client was given; per route, whose turn in the fault mix.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use super::report::{Report, RouteCounts};
use super::{Fault, Kind, OpId};

/// What the client was last given for an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Nothing yet: the attempt is still in the proxy.
    Pending,
    /// A response with this status.
    Status(u16),
    /// No response: the connection was closed, or the client gave up on a held answer.
    Lost,
}

#[derive(Debug)]
struct OpState {
    route: usize,
    attempts: u64,
    reached: u64,
    applied: u64,
    answer: Answer,
}

#[derive(Debug)]
struct RouteState {
    label: String,
    kind: Kind,
    /// Operations seen on this route: the next one gets `faults[turn % faults.len()]`.
    turn: usize,
}

#[derive(Debug, Default)]
struct Books {
    ops: HashMap<OpId, OpState>,
    routes: Vec<RouteState>,
    route_of: HashMap<String, usize>,
}

/// One attempt, as the ledger handed it out.
#[derive(Debug)]
pub(crate) struct Attempt {
    op: OpId,
    /// Which of the operation's attempts this is (1 for the first).
    number: u64,
    /// The fault to inject: the mix's next on an operation's first attempt, else none.
    pub(crate) fault: Fault,
}

/// Shared by every connection of a proxy; a short lock per event.
#[derive(Debug)]
pub(crate) struct Ledger {
    faults: Vec<Fault>,
    books: Mutex<Books>,
}

impl Ledger {
    pub(crate) fn new(faults: Vec<Fault>) -> Self {
        Ledger {
            faults,
            books: Mutex::default(),
        }
    }

    fn books(&self) -> MutexGuard<'_, Books> {
        // A panic elsewhere leaves counts that are still counts.
        self.books.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts an attempt; an operation's first attempt takes the route's next fault.
    /// Operations take turns per route, so each route's share of every fault is exact
    /// whatever order routes interleave in.
    pub(crate) fn begin(&self, op: OpId, kind: Kind, route: String) -> Attempt {
        let mut books = self.books();
        let books = &mut *books;
        if let Some(state) = books.ops.get_mut(&op) {
            state.attempts += 1;
            return Attempt {
                op,
                number: state.attempts,
                fault: Fault::None,
            };
        }
        let index = match books.route_of.get(&route) {
            Some(&index) => index,
            None => {
                books.routes.push(RouteState {
                    label: route.clone(),
                    kind,
                    turn: 0,
                });
                books.route_of.insert(route, books.routes.len() - 1);
                books.routes.len() - 1
            }
        };
        let turn = &mut books.routes[index].turn;
        let fault = self
            .faults
            .get(*turn % self.faults.len().max(1))
            .copied()
            .unwrap_or(Fault::None);
        *turn += 1;
        books.ops.insert(
            op.clone(),
            OpState {
                route: index,
                attempts: 1,
                reached: 0,
                applied: 0,
                answer: Answer::Pending,
            },
        );
        Attempt {
            op,
            number: 1,
            fault,
        }
    }

    /// The attempt reached the upstream, which answered; `applied` unless the answer says
    /// the upstream did not run it (a stored response, or a keyed request refused).
    pub(crate) fn reached(&self, attempt: &Attempt, applied: bool) {
        if let Some(state) = self.books().ops.get_mut(&attempt.op) {
            state.reached += 1;
            state.applied += u64::from(applied);
        }
    }

    /// What the client was given for the attempt. Only the operation's latest attempt
    /// counts: a held answer that ends after the client resent is not what it ended with.
    pub(crate) fn answered(&self, attempt: &Attempt, answer: Answer) {
        if let Some(state) = self.books().ops.get_mut(&attempt.op) {
            if state.attempts == attempt.number {
                state.answer = answer;
            }
        }
    }

    /// The counts so far, one row per route in the order routes were first seen.
    pub(crate) fn report(&self) -> Report {
        let books = self.books();
        let mut rows: Vec<RouteCounts> = books
            .routes
            .iter()
            .map(|r| RouteCounts::new(r.label.clone(), r.kind))
            .collect();
        for state in books.ops.values() {
            let Some(row) = rows.get_mut(state.route) else {
                continue;
            };
            row.operations += 1;
            row.attempts += state.attempts;
            row.upstream_requests += state.reached;
            if row.kind == Kind::Write && state.applied >= 2 {
                row.applied_twice += 1;
            }
            match state.answer {
                Answer::Status(status) if (200..300).contains(&status) => row.answered_ok += 1,
                _ if state.reached > 0 => row.failed_after_upstream += 1,
                _ => row.failed_never_sent += 1,
            }
        }
        Report::new(rows)
    }
}
