//! Lease renewal from the handler's own task on busy runtimes: busy handlers on one thread,
//! handlers waiting on I/O among busy tasks, slowly streamed bodies, detached calls, and a Redis
//! handler renewing itself on a multi-thread runtime among a busy task. From the review, round
//! 2, of lease renewal (08a8b2f).

use crate::busy_runtime_scenario::{busy_for, memory, redis_store, scenario, Work, LEASE};
use retry_safety_testing::runtime_server::Flavour;
use std::time::Duration;

// HELD. Twelve keyed handlers on one thread, each working 15 ms (0.0375 lease) between yields:
// the thread comes back to each every 0.45 lease (within the documented half lease).
/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
fn twelve_busy_handlers_on_one_thread_memory() {
    let stretch = Duration::from_millis(15);
    scenario(
        Flavour::CurrentThread,
        memory,
        busy_for(stretch, 12),
        (0, Duration::ZERO),
        12,
        false,
    )
    .assert_once(12);
}

// Redis on one thread: the documented floor is a quarter lease per round; 12 × 7 ms = 0.21.
/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
fn twelve_busy_handlers_on_one_thread_redis() {
    let stretch = Duration::from_millis(7);
    let (_redis, store) = redis_store("many");
    scenario(
        Flavour::CurrentThread,
        store,
        busy_for(stretch, 12),
        (0, Duration::ZERO),
        12,
        false,
    )
    .assert_once(12);
}

// A handler pending on I/O is never polled: only the ticker renews it. Two other tasks work
// 0.2 lease between yields (a round of 0.4 lease, within the documented half lease).
/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
fn a_handler_waiting_on_io_among_busy_tasks_one_thread_memory() {
    scenario(
        Flavour::CurrentThread,
        memory,
        Work::Pending { for_: LEASE * 3 },
        (2, LEASE.mul_f64(0.2)),
        1,
        false,
    )
    .assert_once(1);
}

// Same for Redis, two tasks of 0.1 lease (a round of 0.2 lease: within a quarter lease).
/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
fn a_handler_waiting_on_io_among_busy_tasks_one_thread_redis() {
    let (_redis, store) = redis_store("pending");
    scenario(
        Flavour::CurrentThread,
        store,
        Work::Pending { for_: LEASE * 3 },
        (2, LEASE.mul_f64(0.1)),
        1,
        false,
    )
    .assert_once(1);
}

// The response body is buffered inside `Renewal::during`: a body that streams over 3 leases
// (0.3 lease of work, then 0.2 lease of waiting, per chunk) keeps its claim.
/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
fn a_slowly_streamed_body_keeps_its_claim_one_thread_memory() {
    scenario(
        Flavour::CurrentThread,
        memory,
        Work::SlowBody {
            chunks: 6,
            stretch: LEASE.mul_f64(0.3),
            gap: LEASE.mul_f64(0.2),
        },
        (0, Duration::ZERO),
        1,
        false,
    )
    .assert_once(1);
}

/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
fn a_slowly_streamed_body_keeps_its_claim_multi_thread_redis() {
    let (_redis, store) = redis_store("body");
    scenario(
        Flavour::MultiThread,
        store,
        Work::SlowBody {
            chunks: 6,
            stretch: LEASE.mul_f64(0.45),
            gap: LEASE.mul_f64(0.05),
        },
        (0, Duration::ZERO),
        1,
        false,
    )
    .assert_once(1);
}

// A detached call (the client went away at 50 ms) keeps renewing on a current-thread runtime.
/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
fn a_detached_call_keeps_its_claim_one_thread_memory() {
    scenario(
        Flavour::CurrentThread,
        memory,
        busy_for(LEASE.mul_f64(0.3), 1),
        (0, Duration::ZERO),
        1,
        true,
    )
    .assert_once(1);
}

/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
fn a_detached_call_keeps_its_claim_one_thread_redis() {
    let (_redis, store) = redis_store("detached");
    scenario(
        Flavour::CurrentThread,
        store,
        busy_for(LEASE.mul_f64(0.2), 1),
        (0, Duration::ZERO),
        1,
        true,
    )
    .assert_once(1);
}

// Redis on a multi-thread runtime: a handler working 0.45 lease between yields (so each of its
// polls renews from its own task, whose Redis reply must wait for a spawned task) while one
// other task is busy too, 0.45 lease between yields: a free worker only at times.
/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
fn redis_multi_thread_handler_renewing_itself_among_a_busy_task() {
    let (_redis, store) = redis_store("mt");
    scenario(
        Flavour::MultiThread,
        store,
        busy_for(LEASE.mul_f64(0.45), 1),
        (1, LEASE.mul_f64(0.45)),
        1,
        false,
    )
    .assert_once(1);
}
