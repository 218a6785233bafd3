//! The counting allocator every allocation test uses: a test binary installs it with
//! `#[global_allocator] static GLOBAL: Counting = Counting;` and reads what it counted. Per
//! thread: the allocations made (a `realloc` is one), the bytes allocated (a `realloc` counts
//! its growth) and the bytes live; across threads, the bytes live. An optional per-thread hook
//! sees each allocation's size (to find where they come from).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, Ordering};

/// The allocator: the system's, counted.
#[derive(Debug)]
pub struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
    static ALLOCATED: Cell<i64> = const { Cell::new(0) };
    static LIVE: Cell<i64> = const { Cell::new(0) };
    static HOOK: Cell<Option<fn(usize)>> = const { Cell::new(None) };
}

static LIVE_EVERYWHERE: AtomicI64 = AtomicI64::new(0);

fn count(allocs: u64, allocated: i64, live: i64, size: usize) {
    // `try_with`: the allocator also runs while thread-locals are torn down.
    let _ = ALLOCS.try_with(|c| c.set(c.get() + allocs));
    let _ = ALLOCATED.try_with(|c| c.set(c.get() + allocated));
    let _ = LIVE.try_with(|c| c.set(c.get() + live));
    LIVE_EVERYWHERE.fetch_add(live, Ordering::Relaxed);
    if allocs > 0 {
        // Taken while it runs: a hook that allocates is not called for its own allocations.
        if let Some(hook) = HOOK.try_with(|h| h.take()).ok().flatten() {
            hook(size);
            let _ = HOOK.try_with(|h| h.set(Some(hook)));
        }
    }
}

// SAFETY: every call is forwarded to `System` unchanged; the counting touches no memory the
// caller owns.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(1, layout.size() as i64, layout.size() as i64, layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(0, 0, -(layout.size() as i64), 0);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let grown = new_size as i64 - layout.size() as i64;
        count(1, grown.max(0), grown, new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Allocations made on this thread so far (a `realloc` is one).
pub fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

/// Bytes allocated on this thread so far (a `realloc` counts its growth).
pub fn allocated() -> i64 {
    ALLOCATED.with(Cell::get)
}

/// Bytes allocated and not freed on this thread (freed elsewhere: negative).
pub fn live() -> i64 {
    LIVE.with(Cell::get)
}

/// Bytes allocated and not freed, on every thread.
pub fn live_everywhere() -> i64 {
    LIVE_EVERYWHERE.load(Ordering::Relaxed)
}

/// The allocations `f` made on this thread.
pub fn allocations(f: impl FnOnce()) -> u64 {
    let before = allocs();
    f();
    allocs() - before
}

/// Calls `hook` with each allocation's size on this thread (`None`: no more).
pub fn on_allocation(hook: Option<fn(usize)>) {
    HOOK.with(|h| h.set(hook));
}

/// Prints where an allocation of `size` bytes came from: the hook a test passes to
/// [`on_allocation`] while it runs with `ALLOC_TRACE=1` (how the keyed path's sites were found).
/// Shows the first four frames of this workspace's crates, closures and `http`.
pub fn trace(size: usize) {
    let frames = std::backtrace::Backtrace::force_capture().to_string();
    let ours: Vec<&str> = frames
        .lines()
        .map(str::trim)
        .filter(|l| {
            l.contains("tower_retry_safety")
                || l.contains("tower_idempotency_keys")
                || l.contains("::{{closure}}")
                || l.contains(" http")
        })
        .take(4)
        .collect();
    eprintln!("allocation of {size} bytes: {}", ours.join(" < "));
}
