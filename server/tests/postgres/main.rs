//! `PostgresStore` and atomic mode on real PostgreSQL: atomic and lease modes, transactions a
//! handler ends by hand, a crash of the server process, and PostgreSQL restarted mid-request.

use retry_safety_testing::pg;

mod atomic_mode;
mod commits_and_rollbacks_by_hand;
mod crash;
mod hand_ended_transactions;
mod handlers_sharing_the_stores_pool;
mod keyed_request;
mod restart;
mod two_modes_on_one_table;
