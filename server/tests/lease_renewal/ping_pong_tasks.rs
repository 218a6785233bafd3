//! Lease renewal among tasks that wake each other directly (a pair that ping-pongs a token):
//! the two cases tokio's current-thread scheduler cannot keep (`#[ignore = "known limit, …"]`,
//! run them with `--ignored`), the same on a multi-thread runtime, and both kept with the
//! drivers polled every 4 task polls. From the review, round 2, of lease renewal (08a8b2f).

use crate::busy_runtime_scenario::{memory, scenario, Work, LEASE};
use retry_safety_testing::runtime_server::Flavour;
use std::time::Duration;

// DEFECT (renewal, current-thread). A keyed handler waiting on I/O (here a timer; a socket is
// the same) while two unrelated tasks hand a token back and forth over channels, each working
// 8 ms (0.02 lease) per turn. Every stretch is far under the documented half lease, and so is a
// round of all busy tasks (16 ms: each has had its turn). But the docs' model — "it reads its
// timers only when every task ready to run has had its turn" — is not tokio's: tasks that wake
// each other directly (a channel, a Notify; not `yield_now`, which defers its wake until after
// the driver) never empty the run queue, and the current-thread scheduler then polls its
// drivers only once every `event_interval` = 61 task polls: 61 × 8 ms ≈ 490 ms > the 400 ms
// lease. The ticker's timer fires that late, the pending handler is not polled either (its
// wake comes from the same driver), so nothing renews the claim for over a lease; the repeat,
// accepted at the next driver poll, finds the key free and runs the handler a second time.
// Seen (3 of 3 runs): runs 2; the repeat at 1.5 leases got a fresh 200, not 409.
//
// Proposed fix: the ticker must not depend on the runtime's timer driver on a current-thread
// runtime: run it on a thread of the layer's own (`std::thread` + `std::thread::sleep`, or a
// one-thread runtime of its own) that sends renewals itself — directly for `MemoryStore`
// (synchronous), and through a connection owned by that thread for `RedisStore` /
// `PostgresStore` (a store-level "renewal channel"). Failing that, correct the guarantee: on a
// current-thread runtime the bound is the work of up to `event_interval` (61) task polls
// between two driver polls, whatever the round; advise `Builder::event_interval(1..=8)` or a
// multi-thread runtime.
/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
#[ignore = "known limit, documented (server docs, Renewal guarantee): on a current-thread runtime, tasks that wake each other delay timer reads to every 61 polls"]
fn a_handler_waiting_on_io_while_two_tasks_ping_pong_one_thread_memory() {
    scenario(
        Flavour::CurrentThread,
        memory,
        Work::Pending { for_: LEASE * 3 },
        (usize::MAX, Duration::from_millis(8)),
        1,
        false,
    )
    .assert_once(1);
}

// HELD. The same on a multi-thread runtime (2 workers): the ping-pong stays on one worker (its
// LIFO slot), the other polls the drivers and runs the ticker.
/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
fn a_handler_waiting_on_io_while_two_tasks_ping_pong_multi_thread_memory() {
    scenario(
        Flavour::MultiThread,
        memory,
        Work::Pending { for_: LEASE * 3 },
        (usize::MAX, Duration::from_millis(8)),
        1,
        false,
    )
    .assert_once(1);
}

// DEFECT (same root cause as the ping-pong test above, on the case the guarantee is written
// for). A keyed handler that yields (`yield_now`) after every 10 ms (0.025 lease) of work, on
// one thread with the same ping-pong pair. `yield_now` defers its wake until after the next
// driver poll, which the ping-pong puts 61 polls (~0.5 s) apart: the thread comes back to the
// handler about once per 1.2 leases, though by the docs' own reckoning (its stretch plus one
// turn of each busy task, 26 ms) it should come back every 0.065 lease. Seen: runs 2.
/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
#[ignore = "known limit, documented (server docs, Renewal guarantee): on a current-thread runtime, tasks that wake each other keep a yielding handler from its next poll for 61 polls"]
fn a_yielding_handler_while_two_tasks_ping_pong_one_thread_memory() {
    scenario(
        Flavour::CurrentThread,
        memory,
        // Six stretches: with the handler polled every ~0.5 s, about 3 s in all.
        Work::Busy {
            stretch: Duration::from_millis(10),
            stretches: 6,
        },
        (usize::MAX, Duration::from_millis(8)),
        1,
        false,
    )
    .assert_once(1);
}

// HELD: the diagnosis of the two ping-pong defects. The same two cases with the runtime's
// drivers polled every 4 task polls (`Builder::event_interval(4)`) keep their claims.
/// Found by the adversarial review, round 2, of lease renewal from a handler's task.
#[test]
fn ping_pong_cases_hold_with_event_interval_4() {
    scenario(
        Flavour::CurrentThreadEventInterval4,
        memory,
        Work::Pending { for_: LEASE * 3 },
        (usize::MAX, Duration::from_millis(8)),
        1,
        false,
    )
    .assert_once(1);
    scenario(
        Flavour::CurrentThreadEventInterval4,
        memory,
        Work::Busy {
            stretch: Duration::from_millis(10),
            stretches: 40,
        },
        (usize::MAX, Duration::from_millis(8)),
        1,
        false,
    )
    .assert_once(1);
}
