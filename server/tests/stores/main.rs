//! The stores behind `IdempotencyLayer`: one contract for every store, late renewals, a fleet
//! sharing one Redis, and fleets beyond one Redis (replicas waited for, failovers through
//! Sentinel, a Redis Cluster), each on topologies the tests start on free loopback ports.

use retry_safety_testing::pg;

mod contract;
mod late_renewals;
mod redis_cluster;
mod redis_failover;
mod redis_fleet;
mod redis_owner;
mod redis_stalls;
