//! Which stripe of deposit counters a thread writes to: threads are numbered in the order they
//! first deposit, so that up to `STRIPES` threads each write a cache line of their own.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

static NEXT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// This thread's number (the caller reduces it to a stripe).
#[inline]
pub(super) fn index() -> usize {
    INDEX
        .try_with(|index| match index.get() {
            usize::MAX => {
                let n = NEXT.fetch_add(1, Ordering::Relaxed) & (usize::MAX >> 1);
                index.set(n);
                n
            }
            n => n,
        })
        // A deposit from a thread-local destructor: any stripe will do.
        .unwrap_or(0)
}
