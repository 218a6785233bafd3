//! The compiler errors a new user meets first point to the fix: one compile-fail case per
//! `#[diagnostic::on_unimplemented]` message (tests/ui/*.rs, with the expected output beside
//! each). The `.stderr` files are rustc's own words, pinned to the toolchain this repository
//! is checked with (rustc 1.95); regenerate them with `TRYBUILD=overwrite` after a toolchain
//! change and read the diff.
//!
//! The lists of implementors in the output depend on the features, so the cases run with the
//! README's command (`--all-features`) only.
#![cfg(all(feature = "redis", feature = "axum", feature = "reqwest-middleware"))]

#[test]
fn diagnostics() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
