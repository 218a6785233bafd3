//! What `classify`, `classify_response`, `decide` and the layer allocate: counted with a global
//! allocator that tallies this thread's allocations (a binary of its own: the allocator is the
//! process's).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        trace(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        trace(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

thread_local! {
    /// Set by a test run with `ALLOC_TRACE=1`: each allocation it counts is printed with the
    /// frames that made it (how the keyed path's sites were found).
    pub(crate) static TRACE: Cell<bool> = const { Cell::new(false) };
}

fn trace(size: usize) {
    // Off while printing: the backtrace allocates too.
    if TRACE.with(|t| t.replace(false)) {
        let frames = std::backtrace::Backtrace::force_capture().to_string();
        let ours: Vec<&str> = frames
            .lines()
            .map(str::trim)
            .filter(|l| {
                l.contains("tower_retry_safety")
                    || l.contains("::{{closure}}")
                    || l.contains(" http")
            })
            .take(4)
            .collect();
        eprintln!("allocation of {size} bytes: {}", ours.join(" < "));
        TRACE.with(|t| t.set(true));
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

pub(crate) fn allocations(f: impl FnOnce()) -> u64 {
    let before = ALLOCS.with(Cell::get);
    f();
    ALLOCS.with(Cell::get) - before
}

mod host_and_path_classify;
mod keyed_memory;
mod layer_and_classify;
