//! The Redis tests' harness (testing/src/redis/) keeps the README's promise: a test's keys
//! are gone when it ends, and where no Redis can be found the failure is one line that says
//! what to install. A binary of its own: it sets `REDIS_URL`, which the other Redis tests read.

use std::time::Duration;

use retry_safety_testing::redis::{count_keys, TestRedis};
use tower_idempotency_keys::{stores::RedisStore, Begin, Fingerprint, IdempotencyStore};

#[tokio::test]
async fn keys_are_deleted_when_a_test_ends_and_no_redis_fails_in_one_line() {
    let redis = TestRedis::start("harness");
    let (url, prefix) = (redis.url().to_owned(), redis.prefix().to_owned());
    let own = redis.is_own();
    let store = RedisStore::connect(&url)
        .await
        .expect("the test's Redis")
        .prefix(prefix.clone());
    let fp = Fingerprint::of(&http::Method::POST, "/v1/send", b"x");
    for key in ["a", "b", "c"] {
        let begun = store.begin(key, fp, Duration::from_secs(60)).await.unwrap();
        assert!(matches!(begun, Begin::Started(_)));
    }
    assert_eq!(redis.keys(), 3);
    drop(store);
    drop(redis);
    if !own {
        assert_eq!(count_keys(&url, &prefix), 0, "keys left under {prefix}");
    }

    // A REDIS_URL that does not answer: the test fails with one line saying what to do.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap();
    // SAFETY: the only test of this binary (that is why it is one), on a current-thread
    // runtime: no other thread of the process reads or writes the environment meanwhile.
    unsafe { std::env::set_var("REDIS_URL", format!("redis://{dead}")) };
    let Err(panic) = std::panic::catch_unwind(|| TestRedis::start("harness")) else {
        panic!("a REDIS_URL that does not answer was taken");
    };
    let message = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(message.contains("install redis-server"), "{message}");
    assert!(!message.contains('\n'), "{message}");
}
