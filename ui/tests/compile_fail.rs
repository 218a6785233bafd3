//! The compiler errors a new user meets first point to the fix: one compile-fail case per
//! `#[diagnostic::on_unimplemented]` message (tests/ui/*.rs, with the expected output beside
//! each). The `.stderr` files are rustc's own words, pinned to the toolchain this repository
//! is checked with (rustc 1.95); regenerate them with `TRYBUILD=overwrite` after a toolchain
//! change and read the diff.
//!
//! The lists of implementors in the output depend on the crate's features: the cases are
//! checked with the client crate without features and the server crate (`tower-idempotency-keys`), the lists a
//! user of the client and the in-memory server sees. Run with `cd ui && cargo test`.

/// The toolchain whose words the `.stderr` files hold.
const PINNED: &str = "rustc 1.95.";

#[test]
fn diagnostics() {
    // Another rustc words its errors differently: the cases would fail on wording, not on a
    // lost message. Skip them there (CI runs the pinned toolchain).
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let version = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if !version.starts_with(PINNED) {
        eprintln!("skipped: the expected output is {PINNED}x's, this is {version:?}");
        return;
    }
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
