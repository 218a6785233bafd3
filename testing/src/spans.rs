//! Span capture in tests that run in parallel: tracing caches, per callsite, whether any
//! subscriber is interested. A callsite first hit on a thread without one is cached as "never"
//! for every thread, and a test's scoped subscriber then sees nothing from it. A global
//! subscriber that is interested "sometimes" in every callsite (and enabled for none) keeps
//! the decision per event, so each thread's scoped subscriber sees its own spans.

use std::sync::Once;

use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};

struct Sometimes;

impl Subscriber for Sometimes {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        Interest::sometimes()
    }
    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::TRACE)
    }
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        false
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {}
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// Call before setting a scoped subscriber that captures spans.
pub fn keep_interest_per_event() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Another global subscriber set first keeps its own rules; this is best effort.
        let _ = tracing::subscriber::set_global_default(Sometimes);
    });
}
