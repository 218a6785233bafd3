//! Nothing to build: the compile-fail cases are in `tests/` (see `tests/compile_fail.rs`).
