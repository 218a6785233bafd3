//! `classify`, `classify_response` and `decide` allocate nothing: counted with a global
//! allocator that tallies this thread's allocations.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

use http::{Method, Request, Response};
use tower_retry_safety::{FailureClass, Idempotency, RetryPolicy};

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations(f: impl FnOnce()) -> u64 {
    let before = ALLOCS.with(Cell::get);
    f();
    ALLOCS.with(Cell::get) - before
}

fn policy(rules: usize) -> RetryPolicy {
    let mut b = RetryPolicy::builder()
        .honor_idempotency_key(true)
        .deadline(Duration::from_secs(30));
    for i in 0..rules {
        b = b.route(
            Method::POST,
            &format!("/v1/r{i}/{{id}}/items/{{item}}"),
            Idempotency::Idempotent,
        );
    }
    b.build().unwrap()
}

#[test]
fn classify_and_decide_allocate_nothing() {
    for rules in [0, 1, 1000] {
        let p = policy(rules);
        let hit = Request::post("http://h/v1/r0/42/items/7?x=1")
            .body(())
            .unwrap();
        let miss = Request::post("http://h/v1/nothing/here").body(()).unwrap();
        let keyed = Request::post("http://h/v1/messages")
            .header("idempotency-key", "\"k-123\"")
            .body(())
            .unwrap();
        let mut marked = Request::get("http://h/v1/x").body(()).unwrap();
        marked.extensions_mut().insert(Idempotency::NonIdempotent);
        let res = Response::builder()
            .status(503)
            .header("retry-after", "3")
            .body(())
            .unwrap();
        let ambiguous = FailureClass::Ambiguous.into();
        let n = allocations(|| {
            for req in [&hit, &miss, &keyed, &marked] {
                let verdict = p.classify(req);
                std::hint::black_box(p.decide(
                    &verdict,
                    &ambiguous,
                    0,
                    Some(Duration::from_secs(5)),
                ));
                let c = p.classify_response(&verdict, &res);
                std::hint::black_box(p.decide(&verdict, &c, 1, None));
            }
        });
        assert_eq!(n, 0, "{rules} rules");
    }
}

#[test]
fn the_counter_counts() {
    // Guards the test above against a counter that never moves.
    let n = allocations(|| {
        std::hint::black_box(vec![1u8; 16]);
    });
    assert_eq!(n, 1);
}
