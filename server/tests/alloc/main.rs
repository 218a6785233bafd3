//! What a keyed request through `IdempotencyLayer` allocates: counted with a global allocator
//! that tallies this thread's allocations (a binary of its own: the allocator is the process's).

pub(crate) use retry_safety_testing::alloc::allocations;
use retry_safety_testing::alloc::Counting;

#[global_allocator]
static GLOBAL: Counting = Counting;

mod deadline_reading;
mod keyed_memory;
