//! What `classify`, `classify_response`, `decide` and the layer allocate: counted with a global
//! allocator that tallies this thread's allocations (a binary of its own: the allocator is the
//! process's).

pub(crate) use retry_safety_testing::alloc::allocations;
use retry_safety_testing::alloc::Counting;

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Prints where an allocation of `size` bytes came from: the allocator's hook while a test
/// runs with `ALLOC_TRACE=1` (how the keyed path's sites were found).
pub(crate) fn trace(size: usize) {
    let frames = std::backtrace::Backtrace::force_capture().to_string();
    let ours: Vec<&str> = frames
        .lines()
        .map(str::trim)
        .filter(|l| {
            l.contains("tower_retry_safety") || l.contains("::{{closure}}") || l.contains(" http")
        })
        .take(4)
        .collect();
    eprintln!("allocation of {size} bytes: {}", ours.join(" < "));
}

mod host_and_path_classify;
mod keyed_memory;
mod layer_and_classify;
