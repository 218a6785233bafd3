//! The chain lab's goals (issue 43 item 5): with deadlines on the wire, no handler at any hop
//! starts after the originating call's deadline, no write is applied twice, and the attempts
//! that reach the last hop are at most 1.5 times the direct call's under the same faults. The
//! same for a first caller that speaks like a Stainless-generated SDK (issue 48 item 9: its
//! read timeout per attempt, its retry count, its own backoff), whose deadline the server
//! reads as that SDK sends it.
//! The "today" row is run too, for its writes: keys keep them single there as well.

use retry_safety_e2e::deadline_chain::{self as chain, Row};

const CALLS: u32 = 16;

/// Before issue 43's server half scoped the deadline into a keyed call's detached task, the
/// deadlines row started 5 of 48 handlers after the deadline; before the server read
/// `x-stainless-read-timeout` (issue 48), the Stainless row started 6 of 48 after its caller
/// gave up on that attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_deadlines_no_hop_starts_work_for_a_caller_who_has_gone() {
    for row in [Row::Deadlines, Row::OneLayer, Row::Stainless] {
        let chained = chain::run(row, CALLS, false).await.expect("chain");
        let direct = chain::run(row, CALLS, true).await.expect("direct");
        assert_eq!(chained.started_late, 0, "{row:?}: {chained:?}");
        assert_eq!(chained.applied_twice, 0, "{row:?}: {chained:?}");
        assert!(
            f64::from(chained.attempts_at_c) <= 1.5 * f64::from(direct.attempts_at_c),
            "{row:?}: {chained:?} against {direct:?}"
        );
    }
}

/// Today's chain: keys keep each write single, whatever the hops resend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn today_writes_are_still_applied_once() {
    let chained = chain::run(Row::Today, CALLS, false).await.expect("chain");
    assert_eq!(chained.applied_twice, 0, "{chained:?}");
}
