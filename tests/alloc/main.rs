//! What `classify`, `classify_response`, `decide` and the layer allocate: counted with a global
//! allocator that tallies this thread's allocations (a binary of its own: the allocator is the
//! process's).

pub(crate) use retry_safety_testing::alloc::allocations;
use retry_safety_testing::alloc::Counting;

#[global_allocator]
static GLOBAL: Counting = Counting;

mod host_and_path_classify;
mod layer_and_classify;
