//! Attribute sets built once per bounded combination and kept, so that recording a request
//! costs a lookup, not the building of four attributes (the SDK's own record is the floor:
//! it hashes and compares the set whatever we do).
//!
//! Every attribute but the host takes a handful of values (a method, a verdict source, a stop
//! reason, a failure class), so a host's sets are a few hundred slots filled on first use. The
//! host is the request's, canonical (every spelling of one host is one value), and the sets
//! of at most [`MAX_HOSTS`] spellings are kept: past them a set is built per request.

use std::sync::{OnceLock, RwLock};

use opentelemetry::KeyValue;

use crate::classify::{FailureClass, VerdictSource};

/// Host spellings whose sets are kept: a client talks to a few; the rest build theirs per
/// request. Each kept one costs about 16 KiB of slots (650 slots of 24 bytes), filled on use.
const MAX_HOSTS: usize = 16;
/// `http.request.method`'s values (RFC 9110's methods, PATCH and `_OTHER`).
const METHODS: usize = 10;
const SOURCES: usize = 4;
/// Stop reasons, with room for one more (one past it is built per request).
const STOPS: usize = 12;
const CLASSES: usize = 4;

/// A bounded attribute value with its place among its kind's values (a stop reason).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Label {
    pub(crate) ordinal: usize,
    pub(crate) name: &'static str,
}

/// The attribute sets of one client's instruments.
#[derive(Debug, Default)]
pub(crate) struct AttributeSets {
    hosts: RwLock<Vec<HostSets>>,
}

/// One host's sets, each slot filled when first used.
#[derive(Debug)]
struct HostSets {
    /// The host as the request spelled it: found without writing it canonically (a few
    /// hundred instructions a request), so two spellings of one host are two entries whose
    /// sets hold the same value.
    spelled: Box<str>,
    /// The canonical host; empty when the request showed none (the sets then leave
    /// `server.address` out).
    host: Box<str>,
    /// `[method, source, stop, host]`.
    by_stop: Box<[OnceLock<Box<[KeyValue]>>]>,
    /// `[method, source, class, host]`.
    by_class: Box<[OnceLock<Box<[KeyValue]>>]>,
    /// `[method, host]`.
    by_method: Box<[OnceLock<Box<[KeyValue]>>]>,
}

/// Which set of a host's: the key of one slot.
#[derive(Clone, Copy)]
pub(crate) enum Set {
    /// Method, verdict source, stop reason (a request's end, a refused retry).
    Stop(Method, VerdictSource, Label),
    /// Method, verdict source, failure class (a resend, a suppressed write).
    Class(Method, VerdictSource, FailureClass),
    /// Method alone (the wait, hedges, stored responses).
    Method(Method),
}

/// `http.request.method`'s value and its ordinal.
#[derive(Clone, Copy)]
pub(crate) struct Method(usize, &'static str);

impl Method {
    /// Bounded as OpenTelemetry's HTTP conventions ask: a method outside RFC 9110's and
    /// PATCH is `_OTHER` (any token is a method: a metric must not grow with them).
    pub(crate) fn of(method: &http::Method) -> Method {
        use http::Method as M;
        let (ordinal, name) = match *method {
            M::GET => (0, "GET"),
            M::HEAD => (1, "HEAD"),
            M::POST => (2, "POST"),
            M::PUT => (3, "PUT"),
            M::DELETE => (4, "DELETE"),
            M::CONNECT => (5, "CONNECT"),
            M::OPTIONS => (6, "OPTIONS"),
            M::TRACE => (7, "TRACE"),
            M::PATCH => (8, "PATCH"),
            _ => (9, "_OTHER"),
        };
        Method(ordinal, name)
    }

    pub(crate) fn attribute(self) -> KeyValue {
        KeyValue::new("http.request.method", self.1)
    }
}

impl Set {
    /// The slot's table and place, or `None` for a value past the tables' room (a variant
    /// added to an enum without growing its table here: built per request, never mixed up).
    fn slot(self) -> Option<(Table, usize)> {
        let (table, at) = match self {
            Set::Stop(m, s, stop) if (s as usize) < SOURCES && stop.ordinal < STOPS => (
                Table::Stop,
                (m.0 * SOURCES + s as usize) * STOPS + stop.ordinal,
            ),
            Set::Class(m, s, class) if (s as usize) < SOURCES && (class as usize) < CLASSES => (
                Table::Class,
                (m.0 * SOURCES + s as usize) * CLASSES + class as usize,
            ),
            Set::Method(m) => (Table::Method, m.0),
            _ => return None,
        };
        (at < table.len()).then_some((table, at))
    }

    /// The set itself, built: what a slot holds.
    fn build(self, host: &str) -> Box<[KeyValue]> {
        let mut set = Vec::with_capacity(4);
        match self {
            Set::Stop(m, s, stop) => set.extend([
                m.attribute(),
                source(s),
                KeyValue::new("retry_safety.stop_reason", stop.name),
            ]),
            Set::Class(m, s, class) => set.extend([
                m.attribute(),
                source(s),
                KeyValue::new("retry_safety.failure_class", class.as_str()),
            ]),
            Set::Method(m) => set.push(m.attribute()),
        }
        if !host.is_empty() {
            set.push(KeyValue::new("server.address", host.to_owned()));
        }
        set.into_boxed_slice()
    }
}

#[derive(Clone, Copy)]
enum Table {
    Stop,
    Class,
    Method,
}

impl Table {
    fn len(self) -> usize {
        match self {
            Table::Stop => METHODS * SOURCES * STOPS,
            Table::Class => METHODS * SOURCES * CLASSES,
            Table::Method => METHODS,
        }
    }
}

fn source(source: VerdictSource) -> KeyValue {
    KeyValue::new("retry_safety.verdict_source", source.as_str())
}

fn slots(n: usize) -> Box<[OnceLock<Box<[KeyValue]>>]> {
    (0..n).map(|_| OnceLock::new()).collect()
}

impl HostSets {
    fn new(spelled: &str) -> Self {
        HostSets {
            spelled: spelled.into(),
            host: crate::classify::host::canonical(spelled).into(),
            by_stop: slots(Table::Stop.len()),
            by_class: slots(Table::Class.len()),
            by_method: slots(Table::Method.len()),
        }
    }

    fn get(&self, set: Set) -> Option<&[KeyValue]> {
        let (table, at) = set.slot()?;
        let slots = match table {
            Table::Stop => &self.by_stop,
            Table::Class => &self.by_class,
            Table::Method => &self.by_method,
        };
        Some(slots.get(at)?.get_or_init(|| set.build(&self.host)))
    }
}

/// A set kept in a slot, or built for one call.
enum Held<'a> {
    Kept(&'a [KeyValue]),
    Built(Box<[KeyValue]>),
}

impl Held<'_> {
    fn as_slice(&self) -> &[KeyValue] {
        match self {
            Held::Kept(set) => set,
            Held::Built(set) => set,
        }
    }
}

impl AttributeSets {
    /// Calls `record` with each of `sets` for `host` (as the request's URI gave it, or none):
    /// kept ones when the host's sets are kept, else built for this call.
    pub(crate) fn with<const N: usize>(
        &self,
        host: Option<&str>,
        sets: [Set; N],
        record: impl FnOnce([&[KeyValue]; N]),
    ) {
        let spelled = host.unwrap_or("");
        let mut hosts = self.read();
        let mut at = hosts.iter().position(|h| *h.spelled == *spelled);
        // Past the bound no lock is taken for writing: those hosts' sets are built per call.
        if at.is_none() && hosts.len() < MAX_HOSTS {
            drop(hosts);
            self.add(spelled);
            hosts = self.read();
            at = hosts.iter().position(|h| *h.spelled == *spelled);
        }
        let kept = at.map(|i| &hosts[i]);
        let held: [Held<'_>; N] =
            std::array::from_fn(|i| match kept.and_then(|h| h.get(sets[i])) {
                Some(set) => Held::Kept(set),
                None => Held::Built(sets[i].build(&crate::classify::host::canonical(spelled))),
            });
        record(std::array::from_fn(|i| held[i].as_slice()));
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<HostSets>> {
        // A poisoned lock only means a record panicked elsewhere: the sets are still whole
        // (a slot is filled whole or not at all).
        self.hosts.read().unwrap_or_else(|e| e.into_inner())
    }

    #[cold]
    fn add(&self, spelled: &str) {
        let mut hosts = self.hosts.write().unwrap_or_else(|e| e.into_inner());
        if hosts.len() < MAX_HOSTS && !hosts.iter().any(|h| *h.spelled == *spelled) {
            hosts.push(HostSets::new(spelled));
        }
    }
}
